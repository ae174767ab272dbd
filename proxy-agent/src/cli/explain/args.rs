//! The command line of `proxy-agent explain`: [`ExplainArgs`] as clap
//! parses it (one variant of [`crate::cli::Command`]), resolved into what
//! to run ([`Args`]). Every mistake is one line naming the flag
//! ([`crate::cli::error`], with [`word`] for the mode flags), and
//! kube-proxy's own flag parsing never sees these.

use std::{net::IpAddr, path::PathBuf};

use clap::ArgGroup;

use super::probe::{Origin, Probe, Proto};
use crate::cli::{
    error::Mistake,
    pins::PinDirArg,
    values::{ip, nonempty_path, port},
};

pub const DEFAULT_SPORT: u16 = 40_000;
/// Distinct source ports: at most every port once.
pub const MAX_FLOWS: u32 = 65_535;

const USAGE: &str = "\
proxy-agent explain --manifests DIR [--config FILE] [--ebpf-config FILE]
                           [--hostname-override NODE] [--local-address IP ...] PACKET
       proxy-agent explain --online [--pin-dir DIR] PACKET

PACKET: --src IP --dst IP --dport N [--sport N] --proto tcp|udp --from pod|outside|host
        [--flows N] [--output text|json]";

/// Explains what the eBPF datapath does with one packet (or N new flows)
///
/// The packet runs through the real programs with BPF_PROG_TEST_RUN. No
/// traffic is sent.
///
/// Offline (--manifests): loads the programs without attaching them,
/// programs the maps from the Services, EndpointSlices and Node in DIR as
/// the agent would, and runs the packet in a private network namespace.
///
/// Online (--online): copies the running agent's pinned maps into a private
/// load of the programs (the live conntrack is never touched) and runs the
/// packet in this network namespace.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
#[command(override_usage = USAGE)]
#[command(group(ArgGroup::new("source").required(true).args(["manifests", "online"])))]
pub struct ExplainArgs {
    #[command(flatten)]
    pub offline: OfflineArgs,

    /// Ask the running agent: copy its pinned maps
    #[arg(long, help_heading = "Online (--online)")]
    pub online: bool,

    #[command(flatten, next_help_heading = "Online (--online)")]
    pub pins: PinDirArg,

    #[command(flatten)]
    pub packet: PacketArgs,

    /// Run N new flows (source ports sport, sport+1, ...) and count the
    /// endpoints reached
    #[arg(long, value_name = "N", value_parser = flows, help_heading = "Packet")]
    pub flows: Option<u32>,

    /// Output format
    #[arg(long, value_enum, default_value_t = Output::Text, help_heading = "Packet")]
    pub output: Output,
}

/// The online form's flags, which no offline flag goes with.
const ONLINE: [&str; 2] = ["online", "pin_dir"];

/// The offline flags: a manifests directory and the agent's configuration.
/// None of them goes with `--online` or `--pin-dir`.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Offline (--manifests)")]
pub struct OfflineArgs {
    /// Services, EndpointSlices and the Node (as for the agent)
    #[arg(long, value_name = "DIR", value_parser = nonempty_path)]
    #[arg(conflicts_with_all = ONLINE)]
    pub manifests: Option<PathBuf>,

    /// KubeProxyConfiguration (clusterCIDR, detectLocalMode,
    /// nodePortAddresses, masqueradeAll, ...)
    #[arg(long, value_name = "FILE", value_parser = nonempty_path)]
    #[arg(conflicts_with_all = ONLINE)]
    pub config: Option<PathBuf>,

    /// EbpfDatapathConfiguration (xdpMode, interfaces, map sizes)
    #[arg(long, value_name = "FILE", value_parser = nonempty_path)]
    #[arg(conflicts_with_all = ONLINE)]
    pub ebpf_config: Option<PathBuf>,

    /// This node's name [default: the config's, else the hostname]
    #[arg(long = "hostname-override", value_name = "NODE", value_parser = hostname)]
    #[arg(conflicts_with_all = ONLINE)]
    pub hostname: Option<String>,

    /// A local IPv4 or IPv6 address of the node, repeatable [default: the
    /// Node object's addresses]
    #[arg(long = "local-address", value_name = "IP", value_parser = ip)]
    #[arg(conflicts_with_all = ONLINE)]
    pub local_addresses: Vec<IpAddr>,
}

/// The packet asked about.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Packet")]
pub struct PacketArgs {
    /// Source address, IPv4 or IPv6
    #[arg(long, value_name = "IP", value_parser = ip)]
    pub src: IpAddr,

    /// Destination address, of the source's family
    #[arg(long, value_name = "IP", value_parser = ip)]
    pub dst: IpAddr,

    /// Destination port
    #[arg(long, value_name = "N", value_parser = port)]
    pub dport: u16,

    /// Source port
    #[arg(long, value_name = "N", value_parser = port, default_value_t = DEFAULT_SPORT)]
    pub sport: u16,

    /// Protocol
    #[arg(long, value_enum)]
    pub proto: Proto,

    /// Where the packet arrives, which decides the programs that see it
    #[arg(long, value_enum)]
    pub from: Origin,
}

impl PacketArgs {
    pub fn probe(&self) -> Probe {
        Probe {
            proto: self.proto,
            src: self.src,
            sport: self.sport,
            dst: self.dst,
            dport: self.dport,
            origin: self.from,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

impl Output {
    /// `report` as its `text`, or as pretty JSON.
    pub fn render<T: serde::Serialize>(
        self,
        report: &T,
        text: impl Fn(&T) -> String,
    ) -> anyhow::Result<String> {
        Ok(match self {
            Output::Text => text(report),
            Output::Json => serde_json::to_string_pretty(report)? + "\n",
        })
    }
}

/// Where the maps come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Offline(Offline),
    Online(PinDirArg),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offline {
    pub manifests: PathBuf,
    pub config: Option<PathBuf>,
    pub ebpf_config: Option<PathBuf>,
    pub hostname: Option<String>,
    pub local_addresses: Vec<IpAddr>,
}

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    pub source: Source,
    pub probe: Probe,
    pub flows: Option<u32>,
    pub output: Output,
}

impl ExplainArgs {
    /// The form and the packet. clap's `source` group has made sure of
    /// exactly one of `--manifests` and `--online`.
    pub fn resolve(self) -> Args {
        let OfflineArgs {
            manifests,
            config,
            ebpf_config,
            hostname,
            local_addresses,
        } = self.offline;
        let source = match manifests {
            Some(manifests) => Source::Offline(Offline {
                manifests,
                config,
                ebpf_config,
                hostname,
                local_addresses,
            }),
            None => Source::Online(self.pins),
        };
        Args {
            source,
            probe: self.packet.probe(),
            flows: self.flows,
            output: self.output,
        }
    }
}

/// explain's wording of the mistakes about its two forms; the rest read as
/// in every subcommand.
pub fn word(mistake: &Mistake) -> Option<String> {
    match mistake {
        Mistake::Conflict { flag, with } => match (flag.as_str(), with.as_str()) {
            ("--pin-dir", _) | (_, "--pin-dir") => {
                Some("--pin-dir: only used with --online".into())
            }
            ("--online", offline) | (offline, "--online") => Some(format!(
                "{offline}: not used with --online (the agent's maps say it all)"
            )),
            _ => None,
        },
        Mistake::Missing(missing) if missing.iter().flatten().any(|f| f == "--online") => {
            Some("--manifests: required (or --online to ask the running agent)".into())
        }
        _ => None,
    }
}

fn flows(value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(n) if (1..=MAX_FLOWS).contains(&n) => Ok(n),
        _ => Err(format!(
            "{value:?} must be a number of flows from 1 to {MAX_FLOWS}"
        )),
    }
}

fn hostname(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;
    use crate::cli::{Command, Parsed, parse as parse_cli};

    fn parse(s: &str) -> Parsed {
        let args: Vec<OsString> = ["proxy-agent", "explain"]
            .into_iter()
            .chain(s.split_whitespace())
            .map(OsString::from)
            .collect();
        parse_cli(&args)
    }

    fn run(s: &str) -> Args {
        match parse(s) {
            Parsed::Run(Command::Explain(a)) => a.resolve(),
            other => panic!("{s}: {other:?}"),
        }
    }

    fn err(s: &str) -> String {
        match parse(s) {
            Parsed::Error(line) => line,
            other => panic!("{s}: {other:?}"),
        }
    }

    const PACKET: &str = "--src 10.0.0.1 --dst 10.96.0.1 --dport 80 --proto tcp --from pod";

    #[test]
    fn offline_with_every_flag() {
        let a = run(&format!(
            "--manifests m --config c.yaml --ebpf-config e.yaml --hostname-override n1 \
             --local-address 192.0.2.1 --local-address=2001:db8::1 {PACKET} --sport 1234 \
             --flows 300 --output json"
        ));
        assert_eq!(
            a.source,
            Source::Offline(Offline {
                manifests: "m".into(),
                config: Some("c.yaml".into()),
                ebpf_config: Some("e.yaml".into()),
                hostname: Some("n1".into()),
                local_addresses: vec![[192, 0, 2, 1].into(), "2001:db8::1".parse().unwrap()],
            })
        );
        assert_eq!(a.probe.sport, 1234);
        assert_eq!(a.probe.dport, 80);
        assert_eq!(a.probe.origin, Origin::Pod);
        assert_eq!(a.flows, Some(300));
        assert_eq!(a.output, Output::Json);
    }

    #[test]
    fn ipv6_packets() {
        let a = run(
            "--online --src 2001:db8:1::2 --dst 2001:db8:ffff::a --dport 80 --proto udp --from outside",
        );
        assert_eq!(a.probe.src, "2001:db8:1::2".parse::<IpAddr>().unwrap());
        assert_eq!(a.probe.dst, "2001:db8:ffff::a".parse::<IpAddr>().unwrap());
        assert!(a.probe.check().is_ok());
        let mixed =
            run("--online --src 10.0.0.1 --dst 2001:db8::a --dport 80 --proto tcp --from pod");
        assert_eq!(
            mixed.probe.check().unwrap_err(),
            "--dst: 2001:db8::a is IPv6 but --src 10.0.0.1 is IPv4 (a packet has one family)"
        );
    }

    #[test]
    fn online_defaults() {
        let a = run(&format!("--online {PACKET}"));
        assert_eq!(a.source, Source::Online(PinDirArg { pin_dir: None }));
        assert_eq!(a.probe.sport, DEFAULT_SPORT);
        assert_eq!(a.output, Output::Text);
        assert_eq!(a.flows, None);
        let a = run(&format!(
            "--online --pin-dir /x {}",
            PACKET.replace("tcp", "UDP")
        ));
        assert_eq!(
            a.source,
            Source::Online(PinDirArg {
                pin_dir: Some("/x".into())
            })
        );
        assert_eq!(a.probe.proto, Proto::Udp);
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
            "--dst: \"x\" is not an IPv4 or IPv6 address"
        );
        assert_eq!(
            err("--manifests m --src 10.0.0.1 --dst 10.0.0.2 --dport 0 --proto tcp --from pod"),
            "--dport: \"0\" is not a port (1-65535)"
        );
        assert_eq!(
            err("--manifests m --src 10.0.0.1 --dst 10.0.0.2 --dport 80 --proto icmp --from pod"),
            "--proto: \"icmp\" must be tcp, udp or sctp"
        );
        assert_eq!(
            err("--manifests m --src 10.0.0.1 --dst 10.0.0.2 --dport 80 --proto tcp --from moon"),
            "--from: \"moon\" must be pod, outside or host"
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
            err(&format!("--manifests m {PACKET} --flows 65536")),
            "--flows: \"65536\" must be a number of flows from 1 to 65535"
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
            err(&format!("--manifests m --online {PACKET}")),
            "--manifests: not used with --online (the agent's maps say it all)"
        );
        assert_eq!(
            err(&format!("--online --local-address 192.0.2.1 {PACKET}")),
            "--local-address: not used with --online (the agent's maps say it all)"
        );
        assert_eq!(
            err(&format!("--manifests m --pin-dir /x {PACKET}")),
            "--pin-dir: only used with --online"
        );
        assert_eq!(
            err(&format!("--pin-dir /x --config c {PACKET}")),
            "--pin-dir: only used with --online"
        );
        assert_eq!(
            err(&format!("--online --online {PACKET}")),
            "--online: given twice"
        );
        assert_eq!(
            err(&format!("--manifests m {PACKET} --bogus 1")),
            "--bogus: unknown flag (see `proxy-agent explain --help`)"
        );
        assert_eq!(
            err(&format!("--manifests m {PACKET} --bogus=1")),
            "--bogus: unknown flag (see `proxy-agent explain --help`)"
        );
        assert_eq!(
            err(&format!("--manifests m {PACKET} stray")),
            "unexpected argument \"stray\" (see `proxy-agent explain --help`)"
        );
        assert_eq!(
            err(&format!("--manifests m {PACKET} --sport")),
            "--sport: needs a value"
        );
        assert_eq!(
            err(&format!("--manifests m --local-address 1.2.3 {PACKET}")),
            "--local-address: \"1.2.3\" is not an IPv4 or IPv6 address"
        );
        assert_eq!(
            err(&format!("--manifests= {PACKET}")),
            "--manifests: must not be empty"
        );
        assert_eq!(
            err(&format!("--manifests m --hostname-override= {PACKET}")),
            "--hostname-override: must not be empty"
        );
    }

    #[test]
    fn help_wins() {
        assert!(matches!(parse("--src x --help"), Parsed::Help(_)));
        assert!(matches!(parse("-h"), Parsed::Help(_)));
        assert!(matches!(parse("help"), Parsed::Help(_)));
        let Parsed::Help(help) = parse("--help") else {
            panic!()
        };
        let text = help.render().to_string();
        assert!(text.contains("proxy-agent explain --online"), "{text}");
        for flag in ["--manifests", "--pin-dir", "--local-address", "--flows"] {
            assert!(text.contains(flag), "{flag}: {text}");
        }
    }
}
