//! The command line of `proxy-agent explain`. Parsed by hand so that every
//! mistake is one line naming the flag (and kube-proxy's own flag parsing
//! never sees these).

use std::{ffi::OsString, net::Ipv4Addr, path::PathBuf};

use super::probe::{Origin, Probe, Proto};

pub const USAGE: &str = "\
Explains what the eBPF datapath does with one packet (or N new flows), by
running it through the real programs with BPF_PROG_TEST_RUN. No traffic is sent.

Usage:
  proxy-agent explain --manifests DIR [--config FILE] [--ebpf-config FILE]
                      [--hostname-override NODE] [--local-address IP ...] PACKET
  proxy-agent explain --online [--pin-dir DIR] PACKET

PACKET:
  --src IP --dst IP --dport N [--sport N] --proto tcp|udp --from pod|outside
  [--flows N] [--output text|json]

Offline (--manifests): loads the programs without attaching them, programs the
maps from the Services, EndpointSlices and Node in DIR as the agent would, and
runs the packet in a private network namespace.
  --manifests DIR          Services, EndpointSlices and the Node (as for the agent)
  --config FILE            KubeProxyConfiguration (clusterCIDR, detectLocalMode,
                           nodePortAddresses, masqueradeAll, ...)
  --ebpf-config FILE       EbpfDatapathConfiguration (xdpMode, interfaces, map sizes)
  --hostname-override NODE this node's name (default: the config's, else the hostname)
  --local-address IP       a local IPv4 address of the node, repeatable
                           (default: the Node object's addresses)

Online (--online): copies the running agent's pinned maps into a private load
of the programs (the live conntrack is never touched) and runs the packet in
this network namespace.
  --pin-dir DIR            default: $KUBE_EBPF_PROXY_PIN_DIR, else
                           /sys/fs/bpf/kube-ebpf-proxy/maps

Packet:
  --src IP, --dst IP       IPv4 source and destination
  --dport N, --sport N     ports (source port default 40000)
  --proto tcp|udp          TCP packets are SYNs
  --from pod|outside       arriving from a pod of this node (tc_from_pod) or on
                           an external interface (xdp_from_netdev, then
                           tc_from_netdev when XDP passes it on)
  --flows N                run N new flows (source ports sport, sport+1, ...)
                           and count the endpoints reached
  --output text|json       default text
";

/// Where the maps come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Offline(Offline),
    Online { pin_dir: Option<PathBuf> },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offline {
    pub manifests: PathBuf,
    pub config: Option<PathBuf>,
    pub ebpf_config: Option<PathBuf>,
    pub hostname: Option<String>,
    pub local_addresses: Vec<Ipv4Addr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    pub source: Source,
    pub probe: Probe,
    pub flows: Option<u32>,
    pub output: Output,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    Help,
    Run(Box<Args>),
}

/// A command-line mistake: `--flag: what is wrong`, or a message alone.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", flag.as_ref().map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct ArgError {
    pub flag: Option<String>,
    pub message: String,
}

fn bad(flag: &str, message: impl Into<String>) -> ArgError {
    ArgError {
        flag: Some(flag.to_owned()),
        message: message.into(),
    }
}

pub const DEFAULT_SPORT: u16 = 40_000;
/// Distinct source ports: at most every port once.
pub const MAX_FLOWS: u32 = 65_535;

const FLAGS_WITH_VALUE: &[&str] = &[
    "--manifests",
    "--config",
    "--ebpf-config",
    "--hostname-override",
    "--local-address",
    "--pin-dir",
    "--src",
    "--dst",
    "--dport",
    "--sport",
    "--proto",
    "--from",
    "--flows",
    "--output",
];
const OFFLINE_ONLY: &[&str] = &[
    "--manifests",
    "--config",
    "--ebpf-config",
    "--hostname-override",
    "--local-address",
];

/// Parses the arguments after `explain`.
pub fn parse(args: &[OsString]) -> Result<Parsed, ArgError> {
    let mut values: Vec<(&'static str, String)> = Vec::new();
    let mut online = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let arg = arg.to_str().ok_or_else(|| ArgError {
            flag: None,
            message: format!("{arg:?} is not valid UTF-8"),
        })?;
        match arg {
            "-h" | "--help" | "help" => return Ok(Parsed::Help),
            "--online" => {
                if online {
                    return Err(bad("--online", "given twice"));
                }
                online = true;
                continue;
            }
            _ => {}
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (arg, None),
        };
        let Some(flag) = FLAGS_WITH_VALUE.iter().copied().find(|f| *f == name) else {
            return Err(if name.starts_with('-') {
                bad(name, "unknown flag (see `proxy-agent explain --help`)")
            } else {
                ArgError {
                    flag: None,
                    message: format!(
                        "unexpected argument {arg:?} (see `proxy-agent explain --help`)"
                    ),
                }
            });
        };
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .and_then(|v| v.to_str())
                .map(str::to_owned)
                .ok_or_else(|| bad(flag, "needs a value"))?,
        };
        if flag != "--local-address" && values.iter().any(|(f, _)| *f == flag) {
            return Err(bad(flag, "given twice"));
        }
        values.push((flag, value));
    }

    let get = |flag: &str| {
        values
            .iter()
            .find(|(f, _)| *f == flag)
            .map(|(_, v)| v.as_str())
    };
    let required = |flag: &'static str| get(flag).ok_or_else(|| bad(flag, "required"));

    let source = if online {
        if let Some(flag) = OFFLINE_ONLY.iter().find(|f| get(f).is_some()) {
            return Err(bad(
                flag,
                "not used with --online (the agent's maps say it all)",
            ));
        }
        Source::Online {
            pin_dir: get("--pin-dir").map(PathBuf::from),
        }
    } else {
        if get("--pin-dir").is_some() {
            return Err(bad("--pin-dir", "only used with --online"));
        }
        let manifests = get("--manifests").ok_or_else(|| {
            bad(
                "--manifests",
                "required (or --online to ask the running agent)",
            )
        })?;
        let hostname = get("--hostname-override").map(str::to_owned);
        if hostname.as_deref().is_some_and(|h| h.trim().is_empty()) {
            return Err(bad("--hostname-override", "must not be empty"));
        }
        let local_addresses = values
            .iter()
            .filter(|(f, _)| *f == "--local-address")
            .map(|(f, v)| ipv4(f, v))
            .collect::<Result<Vec<_>, _>>()?;
        Source::Offline(Offline {
            manifests: nonempty_path("--manifests", manifests)?,
            config: get("--config")
                .map(|p| nonempty_path("--config", p))
                .transpose()?,
            ebpf_config: get("--ebpf-config")
                .map(|p| nonempty_path("--ebpf-config", p))
                .transpose()?,
            hostname,
            local_addresses,
        })
    };

    let probe = Probe {
        proto: match required("--proto")? {
            "tcp" | "TCP" => Proto::Tcp,
            "udp" | "UDP" => Proto::Udp,
            other => return Err(bad("--proto", format!("{other:?} must be tcp or udp"))),
        },
        src: ipv4("--src", required("--src")?)?,
        dst: ipv4("--dst", required("--dst")?)?,
        sport: get("--sport")
            .map(|v| port("--sport", v))
            .transpose()?
            .unwrap_or(DEFAULT_SPORT),
        dport: port("--dport", required("--dport")?)?,
        origin: match required("--from")? {
            "pod" => Origin::Pod,
            "outside" => Origin::Outside,
            other => return Err(bad("--from", format!("{other:?} must be pod or outside"))),
        },
    };
    let flows = get("--flows")
        .map(|v| match v.parse::<u32>() {
            Ok(n) if (1..=MAX_FLOWS).contains(&n) => Ok(n),
            _ => Err(bad(
                "--flows",
                format!("{v:?} must be a number of flows from 1 to {MAX_FLOWS}"),
            )),
        })
        .transpose()?;
    let output = match get("--output").unwrap_or("text") {
        "text" => Output::Text,
        "json" => Output::Json,
        other => return Err(bad("--output", format!("{other:?} must be text or json"))),
    };
    Ok(Parsed::Run(Box::new(Args {
        source,
        probe,
        flows,
        output,
    })))
}

fn ipv4(flag: &str, value: &str) -> Result<Ipv4Addr, ArgError> {
    value
        .trim()
        .parse()
        .map_err(|_| bad(flag, format!("{value:?} is not an IPv4 address")))
}

fn port(flag: &str, value: &str) -> Result<u16, ArgError> {
    match value.trim().parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(bad(flag, format!("{value:?} is not a port (1-65535)"))),
    }
}

fn nonempty_path(flag: &str, value: &str) -> Result<PathBuf, ArgError> {
    if value.is_empty() {
        return Err(bad(flag, "must not be empty"));
    }
    Ok(PathBuf::from(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    fn err(s: &str) -> String {
        parse(&args(s)).unwrap_err().to_string()
    }

    const PACKET: &str = "--src 10.0.0.1 --dst 10.96.0.1 --dport 80 --proto tcp --from pod";

    #[test]
    fn offline_with_every_flag() {
        let Parsed::Run(a) = parse(&args(&format!(
            "--manifests m --config c.yaml --ebpf-config e.yaml --hostname-override n1 \
             --local-address 192.0.2.1 --local-address=192.0.2.2 {PACKET} --sport 1234 \
             --flows 300 --output json"
        )))
        .unwrap() else {
            panic!("help?")
        };
        assert_eq!(
            a.source,
            Source::Offline(Offline {
                manifests: "m".into(),
                config: Some("c.yaml".into()),
                ebpf_config: Some("e.yaml".into()),
                hostname: Some("n1".into()),
                local_addresses: vec![Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2)],
            })
        );
        assert_eq!(a.probe.sport, 1234);
        assert_eq!(a.probe.dport, 80);
        assert_eq!(a.probe.origin, Origin::Pod);
        assert_eq!(a.flows, Some(300));
        assert_eq!(a.output, Output::Json);
    }

    #[test]
    fn online_defaults() {
        let Parsed::Run(a) = parse(&args(&format!("--online {PACKET}"))).unwrap() else {
            panic!()
        };
        assert_eq!(a.source, Source::Online { pin_dir: None });
        assert_eq!(a.probe.sport, DEFAULT_SPORT);
        assert_eq!(a.output, Output::Text);
        assert_eq!(a.flows, None);
    }

    #[test]
    fn mistakes_name_the_flag() {
        assert_eq!(
            err(PACKET),
            "--manifests: required (or --online to ask the running agent)"
        );
        assert_eq!(
            err(&format!("--manifests m {PACKET} --dport 0")),
            "--dport: given twice"
        );
        assert_eq!(
            err("--manifests m --src 10.0.0.1 --dst x --dport 80 --proto tcp --from pod"),
            "--dst: \"x\" is not an IPv4 address"
        );
        assert_eq!(
            err("--manifests m --src 10.0.0.1 --dst 10.0.0.2 --dport 0 --proto tcp --from pod"),
            "--dport: \"0\" is not a port (1-65535)"
        );
        assert_eq!(
            err("--manifests m --src 10.0.0.1 --dst 10.0.0.2 --dport 80 --proto icmp --from pod"),
            "--proto: \"icmp\" must be tcp or udp"
        );
        assert_eq!(
            err("--manifests m --src 10.0.0.1 --dst 10.0.0.2 --dport 80 --proto tcp --from node"),
            "--from: \"node\" must be pod or outside"
        );
        assert_eq!(
            err("--manifests m --src 10.0.0.1 --dst 10.0.0.2 --dport 80 --proto tcp"),
            "--from: required"
        );
        assert_eq!(
            err(&format!("--manifests m {PACKET} --flows 0")),
            "--flows: \"0\" must be a number of flows from 1 to 65535"
        );
        assert_eq!(
            err(&format!("--manifests m {PACKET} --output yaml")),
            "--output: \"yaml\" must be text or json"
        );
        assert_eq!(
            err(&format!("--online --manifests m {PACKET}")),
            "--manifests: not used with --online (the agent's maps say it all)"
        );
        assert_eq!(
            err(&format!("--manifests m --pin-dir /x {PACKET}")),
            "--pin-dir: only used with --online"
        );
        assert_eq!(
            err(&format!("--manifests m {PACKET} --bogus 1")),
            "--bogus: unknown flag (see `proxy-agent explain --help`)"
        );
        assert_eq!(
            err(&format!("--manifests m {PACKET} --sport")),
            "--sport: needs a value"
        );
        assert_eq!(
            err(&format!("--manifests m --local-address 1.2.3 {PACKET}")),
            "--local-address: \"1.2.3\" is not an IPv4 address"
        );
    }

    #[test]
    fn help_wins() {
        assert_eq!(parse(&args("--src x --help")).unwrap(), Parsed::Help);
    }
}
