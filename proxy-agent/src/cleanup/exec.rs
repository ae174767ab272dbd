//! Running the node's tools (iptables-save/-restore, nft, ip, tc, ipset), optionally inside a
//! network namespace, behind a trait so tests can script the answers.

use std::io::{self, Write};
use std::process::{Command, Stdio};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmdOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

pub trait CommandRunner {
    /// Runs `program args...` with `stdin`; `Err` only when it cannot be started at all
    /// (`ErrorKind::NotFound` when the tool is not installed).
    fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> io::Result<CmdOutput>;
}

/// Real processes; inside `netns` (via `ip netns exec`) when set.
#[derive(Debug, Clone, Default)]
pub struct ProcessRunner {
    pub netns: Option<String>,
}

impl CommandRunner for ProcessRunner {
    fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> io::Result<CmdOutput> {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                // `ip netns exec` reports a missing program as a failure, not ENOENT.
                if which(program).is_none() {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{program} not found"),
                    ));
                }
                c
            }
            None => Command::new(program),
        };
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        Ok(CmdOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Finds `program` in PATH (plus the sbin directories root's PATH usually has).
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// Scripted runner: answers by the first matching (program, args prefix) rule; records calls.
#[derive(Debug, Default)]
pub struct FakeRunner {
    pub rules: Vec<(String, Vec<String>, Result<CmdOutput, io::ErrorKind>)>,
    pub calls: Vec<(String, Vec<String>, Option<String>)>,
}

impl FakeRunner {
    pub fn on(&mut self, program: &str, args: &[&str], stdout: &str) -> &mut Self {
        let out = CmdOutput {
            success: true,
            stdout: stdout.into(),
            stderr: String::new(),
        };
        self.rules.push((
            program.into(),
            args.iter().map(|s| s.to_string()).collect(),
            Ok(out),
        ));
        self
    }
    pub fn missing(&mut self, program: &str) -> &mut Self {
        self.rules
            .push((program.into(), vec![], Err(io::ErrorKind::NotFound)));
        self
    }
    /// Every call as one line `program arg arg`.
    pub fn lines(&self) -> Vec<String> {
        self.calls
            .iter()
            .map(|(p, a, _)| {
                std::iter::once(p.clone())
                    .chain(a.iter().cloned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }
}

impl CommandRunner for FakeRunner {
    fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> io::Result<CmdOutput> {
        self.calls.push((
            program.into(),
            args.iter().map(|s| s.to_string()).collect(),
            stdin.map(str::to_string),
        ));
        for (p, prefix, answer) in &self.rules {
            if p == program
                && prefix.len() <= args.len()
                && prefix.iter().zip(args).all(|(a, b)| a == b)
            {
                return answer.clone().map_err(io::Error::from);
            }
        }
        Ok(CmdOutput {
            success: true,
            ..Default::default()
        })
    }
}
