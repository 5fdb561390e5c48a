fn main() {
    let code = match burn_ddp_run::parse(std::env::args().skip(1)) {
        Ok(burn_ddp_run::Command::Launch(config)) => burn_ddp_run::launch(&config),
        Ok(burn_ddp_run::Command::Help) => {
            print!("{}", burn_ddp_run::USAGE);
            0
        }
        Ok(burn_ddp_run::Command::Version) => {
            println!("burn-ddp-run {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Err(message) => {
            eprintln!("burn-ddp-run: {message}\n\n{}", burn_ddp_run::USAGE);
            2
        }
    };
    std::process::exit(code);
}
