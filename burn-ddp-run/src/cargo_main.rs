//! The `cargo ddp` subcommand (cargo runs `cargo-ddp ddp ARGS...`).

use burn_ddp_run::cargo_ddp::{parse_cargo_ddp, CargoDdpCommand, CARGO_DDP_USAGE};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "ddp") {
        args.remove(0);
    }
    let code = match parse_cargo_ddp(args) {
        Ok(CargoDdpCommand::Help) => {
            print!("{CARGO_DDP_USAGE}");
            0
        }
        Ok(CargoDdpCommand::Run(job)) => {
            // Check the launcher flags before a long release build.
            match job.launch_config("PROGRAM").and_then(|_| job.build()) {
                Ok(program) => {
                    let program = program.to_string_lossy().into_owned();
                    let config = job.launch_config(&program).expect("checked above");
                    eprintln!("cargo ddp: launching {program}");
                    burn_ddp_run::launch(&config)
                }
                Err(message) => {
                    eprintln!("cargo ddp: {message}");
                    2
                }
            }
        }
        Err(message) => {
            eprintln!("cargo ddp: {message}\n\n{CARGO_DDP_USAGE}");
            2
        }
    };
    std::process::exit(code);
}
