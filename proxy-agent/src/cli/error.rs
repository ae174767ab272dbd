//! clap's parse errors as one line naming the flag, `--dport: "x" is not a
//! port (1-65535)`, instead of clap's multi-line report with usage. clap's
//! error context says what went wrong with which argument ([`Mistake`]);
//! each subcommand may word a mistake its own way (explain's mode flags,
//! say) and the rest read the same in every subcommand.

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// What clap found wrong with a command line, and the flags concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mistake {
    /// A flag the subcommand does not take (`--bogus`), or a stray word.
    Unknown(String),
    /// A flag that takes one value, given twice.
    Twice(String),
    /// Two flags that exclude each other, in the order clap met them.
    Conflict { flag: String, with: String },
    /// Required flags not given; each entry lists the alternatives that
    /// would do (`["--manifests", "--online"]` for a required group).
    Missing(Vec<Vec<String>>),
    /// A flag given without its value.
    NoValue(String),
    /// A value outside the flag's fixed set.
    NotOneOf {
        flag: String,
        value: String,
        valid: Vec<String>,
    },
    /// A value the flag's parser refused, with its reason.
    Invalid { flag: String, reason: String },
    /// Anything else: the first line of clap's own report.
    Other(String),
}

impl Mistake {
    /// Reads clap's error context.
    pub fn of(e: &clap::Error) -> Self {
        let string = |kind| match e.get(kind) {
            Some(ContextValue::String(s)) => Some(s.clone()),
            _ => None,
        };
        let strings = |kind| match e.get(kind) {
            Some(ContextValue::Strings(v)) => v.clone(),
            Some(ContextValue::String(s)) => vec![s.clone()],
            _ => Vec::new(),
        };
        let arg = string(ContextKind::InvalidArg).map(|a| flag_name(&a));
        let other = || Mistake::Other(first_line(e));
        match (e.kind(), arg) {
            (ErrorKind::UnknownArgument, Some(arg)) => Mistake::Unknown(arg),
            (ErrorKind::ArgumentConflict, Some(flag)) => {
                match string(ContextKind::PriorArg).map(|a| flag_name(&a)) {
                    Some(with) if with == flag => Mistake::Twice(flag),
                    Some(with) => Mistake::Conflict { flag, with },
                    None => other(),
                }
            }
            (ErrorKind::MissingRequiredArgument, _) => {
                let missing: Vec<Vec<String>> = strings(ContextKind::InvalidArg)
                    .iter()
                    .map(|a| alternatives(a))
                    .collect();
                if missing.is_empty() {
                    other()
                } else {
                    Mistake::Missing(missing)
                }
            }
            (ErrorKind::InvalidValue, Some(flag)) => {
                let value = string(ContextKind::InvalidValue).unwrap_or_default();
                let valid = strings(ContextKind::ValidValue);
                if value.is_empty() && valid.is_empty() {
                    Mistake::NoValue(flag)
                } else {
                    Mistake::NotOneOf { flag, value, valid }
                }
            }
            (ErrorKind::ValueValidation, Some(flag)) => {
                let reason = std::error::Error::source(e)
                    .map(ToString::to_string)
                    .unwrap_or_else(|| first_line(e));
                Mistake::Invalid { flag, reason }
            }
            _ => other(),
        }
    }

    /// The line, in the words every subcommand shares; `command` names the
    /// subcommand for the pointer to its help.
    pub fn line(&self, command: &str) -> String {
        let see = format!("(see `proxy-agent {command} --help`)");
        match self {
            Mistake::Unknown(arg) if arg.starts_with('-') => {
                format!("{arg}: unknown flag {see}")
            }
            Mistake::Unknown(arg) => format!("unexpected argument {arg:?} {see}"),
            Mistake::Twice(flag) => format!("{flag}: given twice"),
            Mistake::Conflict { flag, with } => format!("{flag}: not used with {with}"),
            Mistake::Missing(missing) => {
                let first = &missing[0];
                match first.split_first() {
                    Some((flag, [])) => format!("{flag}: required"),
                    Some((flag, rest)) => format!("{flag}: required (or {})", or(rest)),
                    None => "a required flag is missing".to_owned(),
                }
            }
            Mistake::NoValue(flag) => format!("{flag}: needs a value"),
            Mistake::NotOneOf { flag, value, valid } => {
                format!("{flag}: {value:?} must be {}", or(valid))
            }
            Mistake::Invalid { flag, reason } => format!("{flag}: {reason}"),
            Mistake::Other(line) => line.clone(),
        }
    }
}

/// `--dport <N>` -> `--dport`; `--bogus=1` -> `--bogus`.
fn flag_name(arg: &str) -> String {
    let word = arg.split_whitespace().next().unwrap_or(arg);
    match word.split_once('=') {
        Some((flag, _)) if flag.starts_with('-') => flag.to_owned(),
        _ => word.to_owned(),
    }
}

/// A required group `<--manifests <DIR>|--online>` -> its flags; a single
/// argument -> itself.
fn alternatives(arg: &str) -> Vec<String> {
    match arg.strip_prefix('<').and_then(|a| a.strip_suffix('>')) {
        Some(group) if group.starts_with('-') => group.split('|').map(flag_name).collect(),
        _ => vec![flag_name(arg)],
    }
}

/// `a`, `a or b`, `a, b or c`.
fn or(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// clap's report, first line, without its `error: ` prefix.
fn first_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("invalid command line");
    line.trim_start_matches("error: ").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_named_without_their_value_names() {
        assert_eq!(flag_name("--dport <N>"), "--dport");
        assert_eq!(flag_name("--bogus=1"), "--bogus");
        assert_eq!(flag_name("stray"), "stray");
        assert_eq!(
            alternatives("<--manifests <DIR>|--online>"),
            vec!["--manifests", "--online"]
        );
        assert_eq!(alternatives("--from <FROM>"), vec!["--from"]);
        assert_eq!(or(&["a".into(), "b".into(), "c".into()]), "a, b or c");
    }
}
