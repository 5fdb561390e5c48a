fn main() {
    burn_ddp_run::init_logger("burn-ddp-run");
    let config = burn_ddp_run::parse(std::env::args_os()).unwrap_or_else(|err| err.exit());
    std::process::exit(burn_ddp_run::launch(&config));
}
