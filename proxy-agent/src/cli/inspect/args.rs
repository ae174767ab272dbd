//! `proxy-agent inspect`'s command line.

use std::{
    net::{IpAddr, Ipv6Addr},
    path::PathBuf,
};

use crate::{
    cli::{
        explain::args::Output,
        pins::PinDirArg,
        values::{ipv4, nonempty_path, port},
    },
    options::ebpf::STATE_DIR,
};

/// Show what a running agent's datapath holds and does, from its pinned
/// maps and the kernel (nothing is changed).
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
#[command(
    after_help = "Run it in the agent's network namespace (on a node: the host's). \
                  The maps hold ids; the names come from the file the agent publishes \
                  in --state-dir after each sync.\n\n\
                  Examples:\n  proxy-agent inspect services\n  \
                  proxy-agent inspect conntrack --service default/web:http --top 10\n  \
                  proxy-agent inspect maps --output json"
)]
pub struct InspectArgs {
    /// What to show
    #[arg(value_enum)]
    pub what: What,
    #[command(flatten)]
    pub pins: PinDirArg,
    /// Where the agent publishes the names of the maps' ids
    #[arg(long, value_name = "DIR", value_parser = nonempty_path, default_value = STATE_DIR)]
    pub state_dir: PathBuf,
    /// Output format
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// services, conntrack: only this service (NAMESPACE/NAME, or NAMESPACE/NAME:PORT
    /// with the port's name or number)
    #[arg(long, value_name = "NS/NAME[:PORT]", value_parser = service_filter)]
    pub service: Option<ServiceFilter>,
    /// backends, conntrack: only this endpoint
    #[arg(long, value_name = "IP[:PORT]", value_parser = endpoint_filter)]
    pub endpoint: Option<EndpointFilter>,
    /// conntrack: only flows of this client
    #[arg(long, value_name = "IP")]
    pub client: Option<IpAddr>,
    /// conntrack: the N clients, services and backends with the most entries
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub top: Option<u32>,
    /// conntrack: list at most N entries (0: none, only the totals)
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub limit: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum What {
    /// Everything below, briefly
    Summary,
    /// Frontends and their backends, with service names and policies
    Services,
    /// Every backend, with its endpoint's state
    Backends,
    /// Flows, filtered; the heaviest clients and services with --top
    Conntrack,
    /// The datapath's counters, summed over CPUs
    Counters,
    /// Fill and capacity of every map
    Maps,
    /// Which interface runs which program where, and the socket hooks
    Interfaces,
    /// Our loaded programs, with run time and count when BPF stats are on
    Programs,
}

impl What {
    pub const fn name(self) -> &'static str {
        match self {
            What::Summary => "summary",
            What::Services => "services",
            What::Backends => "backends",
            What::Conntrack => "conntrack",
            What::Counters => "counters",
            What::Maps => "maps",
            What::Interfaces => "interfaces",
            What::Programs => "programs",
        }
    }
}

/// `--service NS/NAME[:PORT]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceFilter {
    pub namespace: String,
    pub name: String,
    /// A port's name, or its number.
    pub port: Option<String>,
}

/// `--endpoint IP[:PORT]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointFilter {
    pub ip: IpAddr,
    pub port: Option<u16>,
}

impl EndpointFilter {
    pub fn matches(&self, ip: impl Into<IpAddr>, port: u16) -> bool {
        self.ip == ip.into() && self.port.is_none_or(|p| p == port)
    }
}

pub fn service_filter(value: &str) -> Result<ServiceFilter, String> {
    let bad = || format!("{value:?} is not NAMESPACE/NAME or NAMESPACE/NAME:PORT");
    let (namespace, rest) = value.split_once('/').ok_or_else(bad)?;
    let (name, port) = match rest.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (rest, None),
    };
    if namespace.is_empty() || name.is_empty() || name.contains('/') || port == Some("") {
        return Err(bad());
    }
    Ok(ServiceFilter {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        port: port.map(str::to_owned),
    })
}

/// `IP`, `IPv4:PORT` or `[IPv6]:PORT`.
pub fn endpoint_filter(value: &str) -> Result<EndpointFilter, String> {
    if let Ok(ip) = value.parse::<Ipv6Addr>() {
        return Ok(EndpointFilter {
            ip: IpAddr::V6(ip),
            port: None,
        });
    }
    if let Some(rest) = value.strip_prefix('[') {
        let bad = || format!("{value:?} is not [IPv6]:PORT");
        let (ip, p) = rest.split_once("]:").ok_or_else(bad)?;
        return Ok(EndpointFilter {
            ip: IpAddr::V6(ip.parse().map_err(|_| bad())?),
            port: Some(port(p)?),
        });
    }
    match value.split_once(':') {
        Some((ip, p)) => Ok(EndpointFilter {
            ip: IpAddr::V4(ipv4(ip)?),
            port: Some(port(p)?),
        }),
        None => Ok(EndpointFilter {
            ip: IpAddr::V4(ipv4(value)?),
            port: None,
        }),
    }
}

impl InspectArgs {
    /// Filters given to a view that does not take them are mistakes, named.
    pub fn check(&self) -> Result<(), String> {
        let takes = |flag: &str| match flag {
            "--service" => matches!(self.what, What::Services | What::Conntrack),
            "--endpoint" => matches!(self.what, What::Backends | What::Conntrack),
            _ => self.what == What::Conntrack,
        };
        for (flag, given, views) in [
            ("--service", self.service.is_some(), "services or conntrack"),
            (
                "--endpoint",
                self.endpoint.is_some(),
                "backends or conntrack",
            ),
            ("--client", self.client.is_some(), "conntrack"),
            ("--top", self.top.is_some(), "conntrack"),
        ] {
            if given && !takes(flag) {
                return Err(format!(
                    "{flag}: `inspect {}` takes no such filter (it is for inspect {views})",
                    self.what.name()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn service_filters_name_a_namespace_a_name_and_maybe_a_port() {
        assert_eq!(
            service_filter("e2e/web:http"),
            Ok(ServiceFilter {
                namespace: "e2e".into(),
                name: "web".into(),
                port: Some("http".into())
            })
        );
        assert_eq!(service_filter("e2e/web").unwrap().port, None);
        for bad in ["web", "/web", "e2e/", "e2e/web:", "a/b/c"] {
            assert!(service_filter(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn endpoint_filters_take_an_address_and_maybe_a_port() {
        let ep = endpoint_filter("198.18.2.10:8080").unwrap();
        assert!(ep.matches(Ipv4Addr::new(198, 18, 2, 10), 8080));
        assert!(!ep.matches(Ipv4Addr::new(198, 18, 2, 10), 80));
        let ep = endpoint_filter("198.18.2.10").unwrap();
        assert!(ep.matches(Ipv4Addr::new(198, 18, 2, 10), 80));
        assert!(endpoint_filter("198.18.2.10:0").is_err());
        assert!(endpoint_filter("web").is_err());
        let ep = endpoint_filter("[2001:db8::a]:8080").unwrap();
        assert!(ep.matches("2001:db8::a".parse::<Ipv6Addr>().unwrap(), 8080));
        assert!(!ep.matches("2001:db8::a".parse::<Ipv6Addr>().unwrap(), 80));
        assert!(
            endpoint_filter("2001:db8::a")
                .unwrap()
                .matches("2001:db8::a".parse::<Ipv6Addr>().unwrap(), 1)
        );
        assert!(endpoint_filter("[2001:db8::a]").is_err());
    }
}
