//! The `cargo ddp` subcommand (cargo runs `cargo-ddp ddp ARGS...`).

use burn_ddp_run::cargo_ddp::parse_cargo_ddp;

fn main() {
    burn_ddp_run::init_logger("cargo ddp");
    // Launcher flags are checked while parsing, before a long release build.
    let job = parse_cargo_ddp(std::env::args_os()).unwrap_or_else(|err| err.exit());
    let code = match job.build() {
        Ok(program) => {
            let program = program.to_string_lossy().into_owned();
            let config = job.launch_config(&program).unwrap_or_else(|err| err.exit());
            log::info!("launching {program}");
            burn_ddp_run::launch(&config)
        }
        Err(message) => {
            log::error!("{message}");
            2
        }
    };
    std::process::exit(code);
}
