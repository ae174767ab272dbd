//! `validation.Validate()` for the merged, defaulted configuration (config_rules.md §1, §1.1).
//! Paths are v1alpha1 JSON paths so an operator can find the field in the file.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use super::duration::GoDuration;
use super::error::{FieldError, FieldErrors};
use super::features;
use super::mode::ProxyMode;
use super::types::KubeProxyConfiguration;

/// The kube-proxy minor version whose behaviour we reproduce (flag reference v1.33).
pub const COMPAT_MAJOR: u32 = 1;
pub const COMPAT_MINOR: u32 = 33;

pub const LOCAL_MODES: [&str; 5] = [
    "ClusterCIDR",
    "NodeCIDR",
    "BridgeInterface",
    "InterfaceNamePrefix",
    "",
];

const MODE_DETAIL: &str = "must be iptables, ipvs, nftables, ebpf or blank (blank means the best-available proxy [currently ebpf where the kernel supports it, else nftables, else iptables])";

/// k8s `netutils.ParseIPSloppy` (Go's pre-1.17 `net.ParseIP`): like the standard parser, but
/// IPv4 octets may have leading zeros (`010.0.0.1` is 10.0.0.1).
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    s.parse()
        .ok()
        .or_else(|| parse_ipv4_sloppy(s).map(IpAddr::V4))
}

/// Go's `dtoi`: decimal digits only (leading zeros allowed), at least one, below 0xFFFFFF.
fn dtoi(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut n: u32 = 0;
    for b in s.bytes() {
        n = n * 10 + u32::from(b - b'0');
        if n >= 0xFF_FFFF {
            return None;
        }
    }
    Some(n)
}

fn parse_ipv4_sloppy(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        *o = u8::try_from(dtoi(parts.next()?)?).ok()?;
    }
    parts.next().is_none().then_some(Ipv4Addr::from(octets))
}

/// Go's `ip.To4() != nil`: IPv4, or an IPv4-mapped IPv6 address.
pub fn is_ipv4_like(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    }
}

/// An IP that may be written in brackets (`[::]`), as `bindAddress` accepts.
pub fn parse_bracketed_ip(s: &str) -> Option<IpAddr> {
    let t = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    parse_ip(t)
}

/// k8s `netutils.ParseCIDRSloppy`: `ip/prefix`, host bits allowed, leading zeros accepted in
/// IPv4 octets and in the prefix length (Go's pre-1.17 `net.ParseCIDR`).
pub fn parse_cidr(s: &str) -> Option<IpNet> {
    let (ip, len) = s.split_once('/')?;
    let ip = parse_ip(ip)?;
    let len = u8::try_from(dtoi(len)?).ok()?;
    IpNet::new(ip, len).ok()
}

/// Go's `net.SplitHostPort`.
pub fn split_host_port(s: &str) -> Option<(&str, &str)> {
    let last = s.rfind(':')?;
    let (host, tail_from) = if let Some(rest) = s.strip_prefix('[') {
        // The first ']' must sit just before the last ':'.
        let end = rest.find(']')? + 1;
        if end + 1 != last {
            return None;
        }
        (&s[1..end], end + 1)
    } else {
        let host = &s[..last];
        if host.contains(':') {
            return None;
        }
        (host, 0)
    };
    let open_from = if tail_from == 0 { 0 } else { 1 };
    if s[open_from..].contains('[') || s[tail_from..].contains(']') {
        return None;
    }
    Some((host, &s[last + 1..]))
}

/// k8s `utilnet.ParsePortRange`: `a-b`, `a+n` or a single port, the whole value trimmed but
/// not its parts; empty is accepted.
pub fn parse_port_range(s: &str) -> Option<(u16, u16)> {
    let s = s.trim();
    if s.is_empty() {
        return Some((0, 0));
    }
    let port = |p: &str| p.parse::<u16>().ok();
    match (s.find('-'), s.find('+')) {
        (Some(_), Some(_)) => None,
        (Some(i), None) => {
            let (a, b) = (port(&s[..i])?, port(&s[i + 1..])?);
            (a <= b).then_some((a, b))
        }
        (None, Some(i)) => {
            let (a, n) = (port(&s[..i])?, port(&s[i + 1..])?);
            a.checked_add(n).map(|b| (a, b))
        }
        (None, None) => port(s).map(|p| (p, p)),
    }
}

/// A duration as `field.Invalid` prints it: `metav1.Duration` is a `fmt.Stringer`, so `30s`,
/// not quoted.
fn dur(d: GoDuration) -> String {
    d.to_string()
}

/// A `map[string]bool` as `field.Invalid` prints it (Go's `%#v`).
fn go_map(m: &std::collections::BTreeMap<String, bool>) -> String {
    let items: Vec<String> = m.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
    format!("map[string]bool{{{}}}", items.join(", "))
}

/// `validateHostPort`.
fn host_port(input: &str, path: &str, errs: &mut Vec<FieldError>) {
    let Some((host, port)) = split_host_port(input) else {
        errs.push(FieldError::invalid_str(path, input, "must be IP:port"));
        return;
    };
    if parse_ip(host).is_none() {
        errs.push(FieldError::invalid_str(path, host, "must be a valid IP"));
    }
    match port.parse::<i64>() {
        Ok(p) if (1..=65535).contains(&p) => {}
        _ => errs.push(FieldError::invalid_str(path, port, "must be a valid port")),
    }
}

fn non_negative_dur(path: &str, d: GoDuration, errs: &mut Vec<FieldError>) {
    if d.is_negative() {
        errs.push(FieldError::invalid(
            path,
            dur(d),
            "must be greater than or equal to 0",
        ));
    }
}

fn masquerade_bit(path: &str, bit: Option<i32>, errs: &mut Vec<FieldError>) {
    if let Some(b) = bit
        && !(0..=31).contains(&b)
    {
        errs.push(FieldError::invalid(
            path,
            b.to_string(),
            "must be within the range [0, 31]",
        ));
    }
}

/// The section whose sync periods the active mode uses (conversion rule of config_rules.md §2).
pub fn sync_section(c: &KubeProxyConfiguration) -> (&'static str, GoDuration, GoDuration) {
    match c.mode.as_str() {
        "ipvs" => ("ipvs", c.ipvs.sync_period, c.ipvs.min_sync_period),
        "nftables" => (
            "nftables",
            c.nftables.sync_period,
            c.nftables.min_sync_period,
        ),
        _ => (
            "iptables",
            c.iptables.sync_period,
            c.iptables.min_sync_period,
        ),
    }
}

/// Validates a merged, defaulted configuration. Returns every problem found.
pub fn validate(c: &KubeProxyConfiguration) -> Result<(), FieldErrors> {
    let mut errs = Vec::new();

    if let Err(e) = features::check(&c.feature_gates) {
        errs.push(FieldError::invalid(
            "featureGates",
            go_map(&c.feature_gates),
            e,
        ));
    }

    masquerade_bit(
        "iptables.masqueradeBit",
        c.iptables.masquerade_bit,
        &mut errs,
    );

    // Unified sync periods, taken from the active mode's section.
    let (section, sync, min) = sync_section(c);
    if sync.nanos() <= 0 {
        errs.push(FieldError::invalid(
            format!("{section}.syncPeriod"),
            dur(sync),
            "must be greater than 0",
        ));
    }
    if min.is_negative() {
        errs.push(FieldError::invalid(
            format!("{section}.minSyncPeriod"),
            dur(min),
            "must be greater than or equal to 0",
        ));
    }
    if min > sync {
        // Upstream reports the minSyncPeriod value under the syncPeriod path.
        errs.push(FieldError::invalid(
            format!("{section}.syncPeriod"),
            dur(min),
            "must be greater than or equal to KubeProxyConfiguration.MinSyncPeriod",
        ));
    }

    match c.mode.as_str() {
        "ipvs" => {
            non_negative_dur("ipvs.tcpTimeout", c.ipvs.tcp_timeout, &mut errs);
            non_negative_dur("ipvs.tcpFinTimeout", c.ipvs.tcp_fin_timeout, &mut errs);
            non_negative_dur("ipvs.udpTimeout", c.ipvs.udp_timeout, &mut errs);
            for (i, cidr) in c.ipvs.exclude_cidrs.iter().enumerate() {
                if parse_cidr(cidr).is_none() {
                    errs.push(FieldError::invalid_str(
                        format!("ipvs.excludeCIDRs[{i}]"),
                        cidr,
                        "must be a valid CIDR",
                    ));
                }
            }
        }
        "nftables" => masquerade_bit(
            "nftables.masqueradeBit",
            c.nftables.masquerade_bit,
            &mut errs,
        ),
        _ => {}
    }

    // Conntrack.
    for (path, v) in [
        ("conntrack.maxPerCore", c.conntrack.max_per_core),
        ("conntrack.min", c.conntrack.min),
    ] {
        if let Some(v) = v
            && v < 0
        {
            errs.push(FieldError::invalid(
                path,
                v.to_string(),
                "must be greater than or equal to 0",
            ));
        }
    }
    for (path, d) in [
        (
            "conntrack.tcpEstablishedTimeout",
            c.conntrack.tcp_established_timeout.unwrap_or_default(),
        ),
        (
            "conntrack.tcpCloseWaitTimeout",
            c.conntrack.tcp_close_wait_timeout.unwrap_or_default(),
        ),
        ("conntrack.udpTimeout", c.conntrack.udp_timeout),
        ("conntrack.udpStreamTimeout", c.conntrack.udp_stream_timeout),
    ] {
        non_negative_dur(path, d, &mut errs);
    }

    if !c.mode.is_empty() && ProxyMode::parse(&c.mode).is_none() {
        errs.push(FieldError::invalid_str("mode", &c.mode, MODE_DETAIL));
    }

    if c.client_connection.burst < 0 {
        errs.push(FieldError::invalid(
            "clientConnection.burst",
            c.client_connection.burst.to_string(),
            "must be greater than or equal to 0",
        ));
    }

    if let Some(oom) = c.oom_score_adj
        && !(-1000..=1000).contains(&oom)
    {
        errs.push(FieldError::invalid(
            "oomScoreAdj",
            oom.to_string(),
            "must be within the range [-1000, 1000]",
        ));
    }

    if c.config_sync_period.nanos() <= 0 {
        errs.push(FieldError::invalid(
            "configSyncPeriod",
            dur(c.config_sync_period),
            "must be greater than 0",
        ));
    }

    // bindAddress: one IP or a dual-stack pair (NodeIPOverride); empty allowed.
    if !c.bind_address.is_empty() {
        let parts: Vec<&str> = c.bind_address.split(',').collect();
        let mut families = Vec::new();
        for p in &parts {
            match parse_bracketed_ip(p) {
                Some(ip) => families.push(ip.is_ipv4()),
                None => errs.push(FieldError::invalid_str(
                    "bindAddress",
                    p,
                    "must be a valid IP (e.g. 10.100.0.0 or fde4:8dba:82e1::)",
                )),
            }
        }
        if parts.len() > 2 || (families.len() == 2 && families[0] == families[1]) {
            errs.push(FieldError::invalid_str(
                "bindAddress",
                &c.bind_address,
                "must be a either a single IP or dual-stack pair of IPs (e.g. [10.100.0.0, fde4:8dba:82e1::])",
            ));
        }
    }

    if !c.healthz_bind_address.is_empty() {
        host_port(&c.healthz_bind_address, "healthzBindAddress", &mut errs);
    }
    if !c.metrics_bind_address.is_empty() {
        host_port(&c.metrics_bind_address, "metricsBindAddress", &mut errs);
    }

    // Local traffic detection.
    if !LOCAL_MODES.contains(&c.detect_local_mode.as_str()) {
        errs.push(FieldError::not_supported(
            "detectLocalMode",
            &c.detect_local_mode,
            &LOCAL_MODES,
        ));
    }
    match c.detect_local_mode.as_str() {
        "BridgeInterface" if c.detect_local.bridge_interface.trim().is_empty() => {
            errs.push(FieldError::invalid_str(
                "detectLocal.bridgeInterface",
                &c.detect_local.bridge_interface,
                "must not be empty",
            ))
        }
        "InterfaceNamePrefix" if c.detect_local.interface_name_prefix.trim().is_empty() => errs
            .push(FieldError::invalid_str(
                "detectLocal.interfaceNamePrefix",
                &c.detect_local.interface_name_prefix,
                "must not be empty",
            )),
        "ClusterCIDR" if !c.cluster_cidr.is_empty() => {
            validate_cluster_cidr(&c.cluster_cidr, &mut errs)
        }
        _ => {}
    }

    if parse_port_range(&c.port_range).is_none() {
        errs.push(FieldError::invalid_str(
            "portRange",
            &c.port_range,
            "must be a valid port range (e.g. 300-2000)",
        ));
    }

    validate_node_port_addresses(&c.node_port_addresses, &mut errs);

    if !c.show_hidden_metrics_for_version.is_empty() {
        let valid = format!("{COMPAT_MAJOR}.{}", COMPAT_MINOR - 1);
        if c.show_hidden_metrics_for_version != valid {
            errs.push(FieldError::invalid_str(
                "showHiddenMetricsForVersion",
                &c.show_hidden_metrics_for_version,
                format!(
                    "--show-hidden-metrics-for-version must be omitted or have the value '{valid}'. Only the previous minor version is allowed"
                ),
            ));
        }
    }

    validate_logging(c, &mut errs);

    if errs.is_empty() {
        Ok(())
    } else {
        Err(FieldErrors(errs))
    }
}

fn validate_cluster_cidr(value: &str, errs: &mut Vec<FieldError>) {
    let parts: Vec<&str> = value.split(',').collect();
    let mut families = Vec::new();
    for p in &parts {
        match parse_cidr(p) {
            Some(net) => families.push(matches!(net, IpNet::V4(_))),
            None => errs.push(FieldError::invalid_str(
                "clusterCIDR",
                p,
                "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
            )),
        }
    }
    if parts.len() > 2 || (families.len() == 2 && families[0] == families[1]) {
        errs.push(FieldError::invalid_str(
            "clusterCIDR",
            value,
            "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]",
        ));
    }
}

fn validate_node_port_addresses(addrs: &[String], errs: &mut Vec<FieldError>) {
    for (i, a) in addrs.iter().enumerate() {
        if a == "primary" {
            if addrs.len() != 1 {
                errs.push(FieldError::invalid_str(
                    format!("nodePortAddresses[{i}]"),
                    a,
                    "can't use both 'primary' and CIDRs",
                ));
                break;
            }
            continue;
        }
        if parse_cidr(a).is_none() {
            errs.push(FieldError::invalid_str(
                format!("nodePortAddresses[{i}]"),
                a,
                "must be a valid CIDR",
            ));
        }
    }
}

/// `logsapi.Validate` as far as kube-proxy's registered formats go (only `text`).
fn validate_logging(c: &KubeProxyConfiguration, errs: &mut Vec<FieldError>) {
    let l = &c.logging;
    if l.format != "text" {
        errs.push(FieldError::invalid_str(
            "logging.format",
            &l.format,
            "Unsupported log format",
        ));
    }
    if !l.vmodule.is_empty() && l.format != "text" {
        errs.push(FieldError::forbidden(
            "logging.vmodule",
            "Only supported for text log format",
        ));
    }
    for (i, item) in l.vmodule.iter().enumerate() {
        if item.file_pattern.is_empty() {
            errs.push(FieldError::invalid_str(
                format!("logging.vmodule[{i}].filePattern"),
                &item.file_pattern,
                "file pattern must not be empty",
            ));
        } else if item.file_pattern.contains(['=', ',']) {
            errs.push(FieldError::invalid_str(
                format!("logging.vmodule[{i}].filePattern"),
                &item.file_pattern,
                "must not contain '=' or ','",
            ));
        }
    }
    if l.flush_frequency.nanos() <= 0 {
        errs.push(FieldError::invalid(
            "logging.flushFrequency",
            dur(l.flush_frequency),
            "must be greater than 0",
        ));
    }
    if !features::enabled(&c.feature_gates, "LoggingAlphaOptions") {
        for (name, o) in [("text", &l.options.text), ("json", &l.options.json)] {
            if o.split_stream {
                errs.push(FieldError::forbidden(
                    format!("logging.options.{name}.splitStream"),
                    "Feature LoggingAlphaOptions is disabled",
                ));
            }
            if !o.info_buffer_size.is_zero() {
                errs.push(FieldError::forbidden(
                    format!("logging.options.{name}.infoBufferSize"),
                    "Feature LoggingAlphaOptions is disabled",
                ));
            }
        }
    }
}
