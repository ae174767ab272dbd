//! What explain prints: one packet's verdict, or the tally of N flows, as
//! text for people or as a JSON object whose keys are always present (null
//! when they do not apply), for scripts.

use std::{collections::BTreeMap, fmt::Write as _, net::SocketAddr};

use serde::Serialize;

use super::{
    frontend::Frontend,
    probe::Probe,
    trace::Trace,
    verdict::{self, Verdict},
};

#[derive(Clone, Debug, Serialize)]
pub struct Packet {
    pub protocol: &'static str,
    pub source: String,
    pub destination: String,
    pub from: &'static str,
}

impl Packet {
    fn new(p: &Probe) -> Self {
        Packet {
            protocol: p.proto.name(),
            source: p.source().to_string(),
            destination: p.destination().to_string(),
            from: p.origin.name(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct FrontendJson {
    /// ClusterIP, NodePort, ExternalIP or LoadBalancer.
    pub kind: &'static str,
    /// `namespace/name:port/PROTOCOL`; null online.
    pub service: Option<String>,
    /// internalTrafficPolicy (ClusterIP) or externalTrafficPolicy.
    pub policy_field: &'static str,
    pub policy: &'static str,
    pub endpoints: u16,
    pub source_ranges: bool,
}

impl FrontendJson {
    fn new(f: &Frontend) -> Self {
        FrontendJson {
            kind: f.kind.name(),
            service: f.service.clone(),
            policy_field: f.policy_field(),
            policy: f.policy(),
            endpoints: f.endpoints,
            source_ranges: f.source_ranges,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub program: &'static str,
    pub action: &'static str,
}

/// One packet.
#[derive(Clone, Debug, Serialize)]
pub struct Single {
    pub mode: &'static str,
    pub packet: Packet,
    pub frontend: Option<FrontendJson>,
    /// Session affinity of the frontend, as the probe left it; null: none.
    pub affinity: Option<super::affinity::Pin>,
    /// The frontend's Maglev table at the probe's bucket; null: balanced at random.
    pub maglev: Option<super::maglev::Bucket>,
    /// forwarded, dropped, rejected or passed.
    pub verdict: &'static str,
    /// Forwarded new or established flows: the endpoint chosen.
    pub endpoint: Option<String>,
    /// Forwarded: the destination and source the packet leaves with.
    pub destination: Option<String>,
    pub source: Option<String>,
    pub masqueraded: bool,
    /// Forwarded: new, established or reply.
    pub flow: Option<&'static str>,
    /// Forwarded: xdp_tx, fib_redirect or kernel.
    pub exit: Option<&'static str>,
    #[serde(skip)]
    exit_text: Option<&'static str>,
    /// Rejected: tcp_reset or icmp_port_unreachable.
    pub reject: Option<&'static str>,
    /// Dropped or rejected: the datapath counter naming the reason.
    pub reason: Option<&'static str>,
    pub explanation: Option<&'static str>,
    pub steps: Vec<Step>,
    /// Counters that moved, with how much.
    pub counters: BTreeMap<&'static str, u64>,
}

impl Single {
    pub fn new(
        mode: &'static str,
        probe: &Probe,
        frontend: Option<&Frontend>,
        trace: &Trace,
        verdict: &Verdict,
    ) -> Self {
        let mut s = Single {
            mode,
            packet: Packet::new(probe),
            frontend: frontend.map(FrontendJson::new),
            affinity: None,
            maglev: None,
            verdict: verdict.name(),
            endpoint: None,
            destination: None,
            source: None,
            masqueraded: false,
            flow: None,
            exit: None,
            exit_text: None,
            reject: None,
            reason: None,
            explanation: None,
            steps: trace
                .steps
                .iter()
                .map(|s| Step {
                    program: s.program,
                    action: s.action(),
                })
                .collect(),
            counters: trace.counters.iter().map(|(c, n)| (c.name(), *n)).collect(),
        };
        match *verdict {
            Verdict::Forwarded {
                flow,
                to,
                from,
                masqueraded,
                exit,
            } => {
                if flow != verdict::Flow::Reply {
                    s.endpoint = Some(to.to_string());
                }
                s.destination = Some(to.to_string());
                s.source = Some(from.to_string());
                s.masqueraded = masqueraded;
                s.flow = Some(flow.name());
                s.exit = Some(exit.name());
                s.exit_text = Some(exit.describe());
            }
            Verdict::Dropped { reason } => {
                s.reason = reason.map(|r| r.name());
                s.explanation = reason.map(verdict::describe);
            }
            Verdict::Rejected { reply, reason } => {
                s.reject = Some(reply.name());
                s.reason = reason.map(|r| r.name());
                s.explanation = reason.map(verdict::describe);
            }
            Verdict::Passed => {}
        }
        s
    }

    pub fn with_affinity(self, affinity: Option<super::affinity::Pin>) -> Self {
        Self { affinity, ..self }
    }

    pub fn with_maglev(self, maglev: Option<super::maglev::Bucket>) -> Self {
        Self { maglev, ..self }
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let headline = match self.verdict {
            "forwarded" => {
                let dest = self.destination.as_deref().unwrap_or("?");
                let src = self.source.as_deref().unwrap_or("?");
                match (self.flow, self.masqueraded) {
                    (Some("reply"), true) => {
                        format!("forwarded: reply translated back to the client {dest}, from {src}")
                    }
                    (Some("reply"), false) => {
                        format!("forwarded: reply translated back to {dest}, from {src}")
                    }
                    (_, true) => {
                        format!("forwarded to endpoint {dest}, masqueraded to {src}")
                    }
                    (_, false) => format!("forwarded to endpoint {dest}, source kept ({src})"),
                }
            }
            "dropped" => format!("dropped: {}", self.reason_text()),
            "rejected" => format!(
                "rejected with {}: {}",
                match self.reject {
                    Some("icmp_port_unreachable") => "an ICMP port unreachable",
                    _ => "a TCP RST",
                },
                self.reason_text()
            ),
            _ => "passed through untouched: not service traffic".to_owned(),
        };
        let _ = writeln!(out, "{headline}");
        let p = &self.packet;
        let _ = writeln!(
            out,
            "  packet     {} {} -> {} from {}",
            p.protocol, p.source, p.destination, p.from
        );
        let _ = writeln!(
            out,
            "  frontend   {}",
            frontend_text(self.frontend.as_ref())
        );
        if let Some(pin) = &self.affinity {
            let _ = writeln!(out, "  affinity   {}", super::affinity::text(pin));
        }
        if let Some(bucket) = &self.maglev {
            let _ = writeln!(out, "  maglev     {}", super::maglev::text(bucket));
        }
        if let (Some(flow), Some(exit)) = (self.flow, self.exit_text) {
            let _ = writeln!(out, "  flow       {flow}, {exit}");
        }
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|s| format!("{} {}", s.program, s.action))
            .collect();
        let _ = writeln!(out, "  programs   {}", steps.join(", then "));
        let counters: Vec<String> = self
            .counters
            .iter()
            .map(|(c, n)| format!("{c} +{n}"))
            .collect();
        let _ = writeln!(
            out,
            "  counters   {}",
            if counters.is_empty() {
                "none moved".to_owned()
            } else {
                counters.join(", ")
            }
        );
        let _ = writeln!(out, "  maps       {}", mode_text(self.mode));
        out
    }

    fn reason_text(&self) -> String {
        match (self.reason, self.explanation) {
            (Some(r), Some(e)) if !e.is_empty() => format!("{r} ({e})"),
            (Some(r), _) => r.to_owned(),
            _ => "no counter names a reason".to_owned(),
        }
    }
}

fn frontend_text(f: Option<&FrontendJson>) -> String {
    let Some(f) = f else {
        return "none: no service has this address, port and protocol".to_owned();
    };
    let service = f
        .service
        .as_deref()
        .map(|s| format!(" of {s}"))
        .unwrap_or_default();
    let plural = if f.endpoints == 1 { "" } else { "s" };
    let scope = if f.policy == "Local" {
        " on this node"
    } else {
        ""
    };
    let ranges = if f.source_ranges {
        ", loadBalancerSourceRanges enforced"
    } else {
        ""
    };
    format!(
        "{}{service}, {} {}, {} endpoint{plural}{scope}{ranges}",
        f.kind, f.policy_field, f.policy, f.endpoints
    )
}

fn mode_text(mode: &str) -> &'static str {
    if mode == "online" {
        "a private copy of the running agent's pinned maps"
    } else {
        "programmed from the manifests and configuration (offline)"
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct EndpointCount {
    pub endpoint: String,
    pub flows: u32,
}

/// N new flows.
#[derive(Clone, Debug, Serialize)]
pub struct Flows {
    pub mode: &'static str,
    /// The first flow's packet; the others differ in the source port only.
    pub packet: Packet,
    pub frontend: Option<FrontendJson>,
    /// Session affinity of the frontend after the last flow; null: none.
    pub affinity: Option<super::affinity::Pin>,
    /// The frontend's Maglev table at the last flow's bucket; null: balanced at random.
    pub maglev: Option<super::maglev::Bucket>,
    pub flows: u32,
    /// forwarded, dropped, rejected, passed: how many flows each (all four present).
    pub verdicts: BTreeMap<&'static str, u32>,
    /// Endpoints reached by forwarded flows, by address.
    pub endpoints: Vec<EndpointCount>,
    pub masqueraded: u32,
    /// Drop and reject reasons, by counter name.
    pub reasons: BTreeMap<&'static str, u32>,
}

impl Flows {
    pub fn new(mode: &'static str, probe: &Probe, frontend: Option<&Frontend>) -> Self {
        Flows {
            mode,
            packet: Packet::new(probe),
            frontend: frontend.map(FrontendJson::new),
            affinity: None,
            maglev: None,
            flows: 0,
            verdicts: ["forwarded", "dropped", "rejected", "passed"]
                .into_iter()
                .map(|v| (v, 0))
                .collect(),
            endpoints: Vec::new(),
            masqueraded: 0,
            reasons: BTreeMap::new(),
        }
    }

    pub fn add(&mut self, verdict: &Verdict) {
        self.flows += 1;
        *self.verdicts.entry(verdict.name()).or_default() += 1;
        match *verdict {
            Verdict::Forwarded {
                to, masqueraded, ..
            } => {
                let to = to.to_string();
                match self.endpoints.iter_mut().find(|e| e.endpoint == to) {
                    Some(e) => e.flows += 1,
                    None => self.endpoints.push(EndpointCount {
                        endpoint: to,
                        flows: 1,
                    }),
                }
                self.masqueraded += u32::from(masqueraded);
            }
            Verdict::Dropped { reason } | Verdict::Rejected { reason, .. } => {
                let name = reason.map_or("unknown", |r| r.name());
                *self.reasons.entry(name).or_default() += 1;
            }
            Verdict::Passed => {}
        }
    }

    /// Sorts the endpoints by address, for stable output.
    pub fn with_affinity(self, affinity: Option<super::affinity::Pin>) -> Self {
        Self { affinity, ..self }
    }

    pub fn with_maglev(self, maglev: Option<super::maglev::Bucket>) -> Self {
        Self { maglev, ..self }
    }

    pub fn finish(mut self) -> Self {
        // Unparsable names (none are expected) sort last.
        self.endpoints.sort_by_key(|e| {
            let addr = e.endpoint.parse::<SocketAddr>();
            (addr.is_err(), addr.ok())
        });
        self
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let forwarded = self.verdicts.get("forwarded").copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "{} new flows: {forwarded} forwarded to {} endpoint{}",
            self.flows,
            self.endpoints.len(),
            if self.endpoints.len() == 1 { "" } else { "s" }
        );
        let p = &self.packet;
        let _ = writeln!(
            out,
            "  packet     {} {} -> {} from {} (source port {} up)",
            p.protocol,
            p.source
                .rsplit_once(':')
                .map_or(p.source.as_str(), |(ip, _)| ip),
            p.destination,
            p.from,
            p.source.rsplit_once(':').map_or("?", |(_, port)| port),
        );
        let _ = writeln!(
            out,
            "  frontend   {}",
            frontend_text(self.frontend.as_ref())
        );
        if let Some(pin) = &self.affinity {
            let _ = writeln!(out, "  affinity   {}", super::affinity::text(pin));
        }
        if let Some(bucket) = &self.maglev {
            let _ = writeln!(out, "  maglev     {}", super::maglev::text(bucket));
        }
        let verdicts: Vec<String> = self
            .verdicts
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(v, n)| format!("{v} {n}"))
            .collect();
        let _ = writeln!(out, "  verdicts   {}", verdicts.join(", "));
        if forwarded > 0 {
            let _ = writeln!(out, "  masquerade {} of {forwarded}", self.masqueraded);
        }
        for e in &self.endpoints {
            let _ = writeln!(out, "  endpoint   {:<21} {} flows", e.endpoint, e.flows);
        }
        for (reason, n) in &self.reasons {
            let _ = writeln!(out, "  reason     {reason}: {n} flows");
        }
        let _ = writeln!(out, "  maps       {}", mode_text(self.mode));
        out
    }
}
