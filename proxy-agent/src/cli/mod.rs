//! The agent's subcommands for operators, one clap-derive family:
//! `proxy-agent explain ...`, `emit ...`, `inspect ...` and `monitor ...`, each a variant of [`Command`].
//!
//! The agent itself takes kube-proxy's flat flags, exactly upstream's
//! ([`crate::options`]); a subcommand is only recognised by name in first
//! position ([`main`]), so those flags never meet this parser and a
//! subcommand's flags never meet kube-proxy's.
//!
//! Shared by the subcommands: [`error`] (clap's errors as one line naming
//! the flag), [`values`] (value parsers), [`pins`] (the running agent's
//! pinned maps, `--pin-dir`) and [`packet`] (building and reading frames).

pub mod emit;
pub mod error;
pub mod explain;
pub mod inspect;
pub mod monitor;
pub mod packet;
pub mod pins;
pub mod values;

use std::{ffi::OsString, fmt, process::ExitCode};

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use error::Mistake;

/// `proxy-agent SUBCOMMAND ...`.
#[derive(Debug, Parser)]
#[command(name = "proxy-agent", bin_name = "proxy-agent")]
#[command(disable_help_subcommand = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Emit(emit::EmitArgs),
    Explain(explain::args::ExplainArgs),
    Inspect(inspect::args::InspectArgs),
    Monitor(monitor::args::MonitorArgs),
}

/// What a subcommand's command line comes to.
#[derive(Debug)]
pub enum Parsed {
    Run(Command),
    /// `--help`, `-h` or `help`: clap's help, for stdout and exit 0.
    Help(Box<clap::Error>),
    /// A mistake, as one line naming the flag.
    Error(String),
}

/// Runs the subcommand `args[1]` names (`args` is the whole command line,
/// program name first); `None` when `args[1]` names none, so the agent
/// parses kube-proxy's flags as ever.
pub fn main(args: &[OsString]) -> Option<ExitCode> {
    if !is_subcommand(args.get(1)?) {
        return None;
    }
    Some(match parse(args) {
        Parsed::Run(command) => run(command),
        Parsed::Help(help) => {
            let _ = help.print();
            ExitCode::SUCCESS
        }
        Parsed::Error(line) => fail(line),
    })
}

/// Whether `word` names a subcommand.
pub fn is_subcommand(word: &std::ffi::OsStr) -> bool {
    word.to_str()
        .is_some_and(|w| Cli::command().find_subcommand(w).is_some())
}

/// Parses a subcommand's command line (program name first).
pub fn parse(args: &[OsString]) -> Parsed {
    let mut cli = Cli::command();
    cli.build();
    // Help wins over any mistake, even one before it (`--src x --help`).
    let name = args.get(1).and_then(|a| a.to_str()).unwrap_or_default();
    if let Some(flag) = cli
        .find_subcommand(name)
        .and_then(|sub| asks_for_help(sub, args.get(2..).unwrap_or_default()))
    {
        let help = cli.try_get_matches_from_mut([&args[0], &args[1], &OsString::from(flag)]);
        if let Err(e) = help {
            return Parsed::Help(Box::new(e));
        }
    }
    let parsed = cli
        .try_get_matches_from_mut(args)
        .and_then(|m| Cli::from_arg_matches(&m));
    match parsed {
        Ok(cli) => Parsed::Run(cli.command),
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => Parsed::Help(Box::new(e)),
        Err(e) => {
            let mistake = Mistake::of(&e);
            let line = word(name, &mistake).unwrap_or_else(|| mistake.line(name));
            Parsed::Error(line)
        }
    }
}

/// A subcommand's own wording of a mistake, where it has one.
fn word(subcommand: &str, mistake: &Mistake) -> Option<String> {
    match subcommand {
        "explain" => explain::args::word(mistake),
        _ => None,
    }
}

/// The help flag among `words` (the arguments after the subcommand), if one
/// stands where a flag could: not as a flag's value, not after `--`.
fn asks_for_help(sub: &clap::Command, words: &[OsString]) -> Option<&'static str> {
    let mut words = words.iter().filter_map(|w| w.to_str());
    while let Some(word) = words.next() {
        match word {
            "--" => return None,
            "-h" => return Some("-h"),
            "--help" | "help" => return Some("--help"),
            _ => {}
        }
        let takes_value = |arg: &clap::Arg| arg.get_action().takes_values();
        let separate_value = if let Some(long) = word.strip_prefix("--") {
            !long.contains('=')
                && sub
                    .get_arguments()
                    .any(|a| a.get_long() == Some(long) && takes_value(a))
        } else if let Some(short) = word.strip_prefix('-') {
            let mut chars = short.chars();
            matches!((chars.next(), chars.next()), (Some(c), None)
                if sub.get_arguments().any(|a| a.get_short() == Some(c) && takes_value(a)))
        } else {
            false
        };
        if separate_value {
            words.next();
        }
    }
    None
}

fn run(command: Command) -> ExitCode {
    match command {
        Command::Emit(args) => emit::main(args),
        Command::Explain(args) => explain::main(args),
        Command::Inspect(args) => inspect::main(args),
        Command::Monitor(args) => monitor::main(args),
    }
}

/// `error: ...` on stderr, one line however many the error has, and exit 1.
pub fn fail(e: impl fmt::Display) -> ExitCode {
    let text = e.to_string();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    eprintln!("error: {}", lines.join("; "));
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn only_subcommands_in_first_position_are_ours() {
        assert!(is_subcommand("explain".as_ref()));
        assert!(is_subcommand("inspect".as_ref()));
        assert!(is_subcommand("monitor".as_ref()));
        assert!(is_subcommand("emit".as_ref()));
        for other in ["--hostname-override", "help", "--help", "apply", ""] {
            assert!(!is_subcommand(other.as_ref()), "{other}");
        }
    }

    #[test]
    fn help_is_found_where_a_flag_could_stand() {
        let mut cli = Cli::command();
        cli.build();
        let sub = cli.find_subcommand("explain").unwrap();
        let asks = |s: &str| asks_for_help(sub, &words(s));
        assert_eq!(asks("--src x --help"), Some("--help"));
        assert_eq!(asks("-h"), Some("-h"));
        assert_eq!(asks("--online help"), Some("--help"));
        assert_eq!(asks("--hostname-override help --src x"), None);
        assert_eq!(asks("--hostname-override=x help"), Some("--help"));
        assert_eq!(asks("--src x -- --help"), None);
        assert_eq!(asks("--src x"), None);
    }
}
