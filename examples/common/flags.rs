//! A small command-line flag parser shared by the examples, so their flags read
//! like the PyTorch scripts' argparse flags (`--batch-size` and `--batch_size`).

use std::collections::HashMap;
use std::str::FromStr;

/// One flag: its name (with dashes), default and help.
pub struct Flag {
    pub name: &'static str,
    pub default: Option<&'static str>,
    pub help: &'static str,
}

/// Parsed flags; `get` converts on demand.
pub struct Flags {
    program: &'static str,
    values: HashMap<&'static str, String>,
}

impl Flags {
    /// Parses `std::env::args()`; prints help and exits on `--help`, prints the
    /// error and usage and exits with 2 on a bad flag.
    pub fn parse(program: &'static str, about: &str, spec: &[Flag]) -> Self {
        match Self::parse_from(program, spec, std::env::args().skip(1)) {
            Ok(Some(flags)) => flags,
            Ok(None) => {
                print!("{}", usage(program, about, spec));
                std::process::exit(0)
            }
            Err(message) => {
                eprintln!("{program}: {message}\n\n{}", usage(program, about, spec));
                std::process::exit(2)
            }
        }
    }

    /// Parses `args`; `Ok(None)` means help was asked for.
    pub fn parse_from(
        program: &'static str,
        spec: &[Flag],
        args: impl IntoIterator<Item = String>,
    ) -> Result<Option<Self>, String> {
        let mut values = HashMap::new();
        for flag in spec {
            if let Some(default) = flag.default {
                values.insert(flag.name, default.to_string());
            }
        }
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "-h" || arg == "--help" {
                return Ok(None);
            }
            let Some(body) = arg.strip_prefix("--") else {
                return Err(format!("unexpected argument {arg:?}"));
            };
            let (name, inline) = match body.split_once('=') {
                Some((name, value)) => (name.replace('_', "-"), Some(value.to_string())),
                None => (body.replace('_', "-"), None),
            };
            let flag = spec
                .iter()
                .find(|f| f.name == name)
                .ok_or_else(|| format!("unknown flag --{name}"))?;
            let value = inline
                .or_else(|| args.next())
                .ok_or_else(|| format!("--{name} needs a value"))?;
            values.insert(flag.name, value);
        }
        Ok(Some(Self { program, values }))
    }

    /// The flag's value converted to `T`, exiting with a clear message if it
    /// does not convert.
    pub fn get<T: FromStr>(&self, name: &str) -> T {
        self.try_get(name).unwrap_or_else(|message| {
            eprintln!("{}: {message}", self.program);
            std::process::exit(2)
        })
    }

    /// The flag's value, or `None` when it has no default and was not given.
    pub fn optional<T: FromStr>(&self, name: &str) -> Option<T> {
        self.values.get(name).map(|_| self.get(name))
    }

    fn try_get<T: FromStr>(&self, name: &str) -> Result<T, String> {
        let value = self
            .values
            .get(name)
            .ok_or_else(|| format!("--{name} is required"))?;
        value
            .parse()
            .map_err(|_| format!("--{name} {value:?} is not a valid value"))
    }
}

fn usage(program: &str, about: &str, spec: &[Flag]) -> String {
    let mut text = format!("{about}\n\nUSAGE:\n    {program} [FLAGS]\n\nFLAGS:\n");
    for flag in spec {
        let default = flag
            .default
            .map(|d| format!(" (default {d})"))
            .unwrap_or_default();
        text.push_str(&format!("    --{:<18} {}{default}\n", flag.name, flag.help));
    }
    text.push_str("    --help               print this help\n\nUnderscores may replace dashes in flag names.\n");
    text
}
