//! The Markdown report and its plots.

use std::{fmt::Write as _, path::Path};

use super::{Datapath, Outcome, Sample, Settings, common::median};

type SampleValue = fn(&Sample) -> f64;

/// A data-plane figure: its name, unit, and how it is read off a sample.
struct Figure {
    title: &'static str,
    unit: &'static str,
    value: SampleValue,
    /// Higher is better (rates) or lower (CPU per packet).
    higher_better: bool,
}

const FIGURES: [Figure; 5] = [
    Figure {
        title: "connections/s, pod to ClusterIP",
        unit: "conn/s",
        value: |s| s.conn_rate,
        higher_better: true,
    },
    Figure {
        title: "connections/s, outside to NodePort",
        unit: "conn/s",
        value: |s| s.node_port_rate,
        higher_better: true,
    },
    Figure {
        title: "bulk TCP, pod to ClusterIP",
        unit: "Gbit/s",
        value: |s| s.bulk_bps / 1e9,
        higher_better: true,
    },
    Figure {
        title: "small UDP datagrams received, pod to ClusterIP",
        unit: "kpps",
        value: |s| s.udp_rate / 1e3,
        higher_better: true,
    },
    Figure {
        title: "softirq CPU per UDP datagram",
        unit: "ns",
        value: |s| s.softirq_ns,
        higher_better: false,
    },
];

fn raw_index(datapaths: &[Datapath]) -> usize {
    datapaths
        .iter()
        .position(|d| d.name == "raw")
        .expect("checked")
}

/// Per round, the datapath's figure over raw's in the same round: median and range.
fn ratio(row: &[Outcome], raw: usize, i: usize, value: SampleValue) -> Option<(f64, f64, f64)> {
    let r: Vec<f64> = row[i]
        .samples
        .iter()
        .zip(&row[raw].samples)
        .map(|(s, r)| value(s) / value(r))
        .collect();
    if r.is_empty() {
        return None;
    }
    let (lo, hi) = r
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
    Some((median(&r), lo, hi))
}

fn value(out: &Outcome, f: fn(&Sample) -> f64) -> f64 {
    median(&out.samples.iter().map(f).collect::<Vec<_>>())
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The `p` percentile of unsorted `values`; none of none.
fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| pct(&v, p))
}

pub fn render(
    scales: &[usize],
    datapaths: &[Datapath],
    outcomes: &[Vec<Outcome>],
    s: &Settings,
    setup: &str,
    machine: &str,
) -> String {
    let raw = raw_index(datapaths);
    let mut out = String::new();
    let _ = writeln!(out, "# End-to-end benchmark: traffic through a service\n");
    let _ = writeln!(
        out,
        "`cargo xtask bench e2e`, the node on {machine} ({}). {setup} N \
         services of one TCP port with {} endpoints behind each (written as JSON lists, the form \
         the API server lists them in); the clients go to the last one (last by name as well: \
         rule lists walked in order reach it last), which has two server pods behind it, is also \
         a NodePort and has a UDP port. `raw`: no agent, the clients go to a server pod's address, \
         routed by the same node; `raw-again`: the same in a testbed of its own, measured as \
         another datapath, so its ratios to raw are the run's noise. {} rounds, the datapaths measured in a rotating order within \
         each; per round and datapath: {} short connections (connect, a small HTTP request, the \
         reply to EOF, close; one at a time) from the pod to the ClusterIP and as many from \
         outside to the NodePort, {}, one bulk TCP stream from the pod for {} ms, and small UDP \
         datagrams (18-byte payload) from one pod socket for {} ms, counted where the servers \
         receive them; softirq CPU is the node's /proc/stat over every CPU during the UDP run, per \
         datagram received. Ratios are to raw in the same round: the median over rounds, and \
         their range (the run's noise); values are medians over rounds.\n",
        jiff::Zoned::now().strftime("%Y-%m-%d %H:%M %Z"),
        super::agent::endpoints_per_service(),
        s.rounds,
        s.connections,
        match s.conn_passes {
            1 => "all at once".to_owned(),
            p => format!(
                "in {p} passes over the datapaths (each datapath's connections a moment from raw's: \
                 this machine's speed drifts over seconds)"
            ),
        },
        s.stream.as_millis(),
        s.stream.as_millis(),
    );
    let _ = writeln!(
        out,
        "Control plane: *start* is the time from the agent's start (a new process, timed from its pid; the \
         median of {} starts per scale, each from cold: the node cleaned up with `proxy-agent --cleanup` \
         before it, the other testbeds' agents paused) to every service programmed: the later of the target's ClusterIP and the NodePort answering and the \
         end of the first sync (all services), as the agent's `kubeproxy_sync_proxy_rules_last_timestamp_seconds` \
         gives it; *RSS* the agent's resident memory after the rounds; \
         *endpoint change* the time from the target service's endpoints replaced by a third \
         server in its EndpointSlice (the file moved into place by a worker on the node; the \
         agent reads it at once) *to maps*: to the agent's BPF maps balancing the target to it \
         (read by that worker every 100 µs; eBPF modes), and *to packets*: to the first \
         connection from the pod that reaches it (one attempt per millisecond once the maps \
         hold it: the first does), {} times per scale, \
         each change alone: made once the agent's last sync (its metrics' timestamp) is 1.2 s \
         old, so that it never waits for minSyncPeriod (upstream's default, 1 s from a sync's \
         end: a rate limit, not the agent's latency), the agent's threads kept off the \
         workloads' CPU meanwhile (see the setup). p99 of {} changes is their maximum. \
         Beside each change the bench counts, from the move to the maps holding it, the CPU \
         time other tasks ran on the agent's CPUs (the schedstat of the tasks last seen on \
         those CPUs, read just before and just after; the worker watching the maps is on \
         another CPU) and the time the agent's threads waited for a CPU: on a kernel without \
         preemption (these VMs' `PREEMPT_NONE`) a kernel thread that runs for milliseconds \
         there (kdamond, rcu, kworkers) holds the agent off for as long. A change with both \
         counts at or above 1 ms is one the machine held the agent off in.\n",
        s.starts, s.changes, s.changes
    );
    for (k, &n) in scales.iter().enumerate() {
        let row = &outcomes[k];
        let _ = writeln!(out, "## {n} service{}\n", if n == 1 { "" } else { "s" });
        let names: Vec<&str> = datapaths.iter().map(|d| d.name.as_str()).collect();
        let _ = writeln!(
            out,
            "| figure | {} |\n|---|{}",
            names.join(" | "),
            "---|".repeat(names.len())
        );
        let cells = |f: &dyn Fn(usize, &Outcome) -> String| -> String {
            row.iter()
                .enumerate()
                .map(|(i, o)| match &o.skipped {
                    Some(why) => format!("not run: {why}"),
                    None => f(i, o),
                })
                .collect::<Vec<_>>()
                .join(" | ")
        };
        for fig in &FIGURES {
            let line = cells(&|i, o| {
                let v = value(o, fig.value);
                let v = if v >= 100.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.2}")
                };
                match ratio(row, raw, i, fig.value) {
                    Some((m, lo, hi)) if i != raw => format!("{v} · **{m:.2}** ({lo:.2}–{hi:.2})"),
                    _ => v,
                }
            });
            let _ = writeln!(out, "| {} ({}) | {line} |", fig.title, fig.unit);
        }
        let latencies: [(&str, SampleValue); 4] = [
            ("pod to ClusterIP connection p50 (µs)", |s| s.conn_p50_us),
            ("pod to ClusterIP connection p99 (µs)", |s| s.conn_p99_us),
            ("outside to NodePort connection p50 (µs)", |s| {
                s.node_port_p50_us
            }),
            ("outside to NodePort connection p99 (µs)", |s| {
                s.node_port_p99_us
            }),
        ];
        for (title, get) in latencies {
            let line = cells(&|_, o| format!("{:.0}", value(o, get)));
            let _ = writeln!(out, "| {title} | {line} |");
        }
        let control =
            |f: fn(&Outcome) -> Option<String>| cells(&|_, o| f(o).unwrap_or_else(|| "—".into()));
        let _ = writeln!(
            out,
            "| agent start to all programmed | {} |",
            control(|o| (!o.start_s.is_empty()).then(|| format!("{:.2} s", median(&o.start_s))))
        );
        let _ = writeln!(
            out,
            "| agent RSS after the rounds | {} |",
            control(|o| o.rss_mb.map(|m| format!("{m:.0} MB")))
        );
        fn to_maps(o: &Outcome) -> &Vec<f64> {
            &o.change_maps_ms
        }
        fn to_packets(o: &Outcome) -> &Vec<f64> {
            &o.change_ms
        }
        type Times = fn(&Outcome) -> &Vec<f64>;
        for (title, p, of) in [
            ("endpoint change to maps p50", 0.5, to_maps as Times),
            ("endpoint change to maps p99", 0.99, to_maps),
            ("endpoint change to packets p50", 0.5, to_packets),
            ("endpoint change to packets p99", 0.99, to_packets),
        ] {
            let line = cells(&|_, o| {
                percentile(of(o), p).map_or_else(|| "—".into(), |v| format!("{v:.1} ms"))
            });
            let _ = writeln!(out, "| {title} | {line} |");
        }
        let line = cells(&|_, o| {
            held_off(o).map_or_else(
                || "—".into(),
                |h| {
                    format!(
                        "{} of {}; at most {:.1} ms of others, {:.1} ms waited",
                        h.held, h.of, h.max_taken, h.max_waited
                    )
                },
            )
        });
        let _ = writeln!(
            out,
            "| endpoint changes the machine held the agent off in (other tasks ran ≥ {HELD_OFF_MS} ms on its CPUs and it waited ≥ {HELD_OFF_MS} ms for one) | {line} |"
        );
        let line = cells(&|_, o| {
            held_off(o)
                .and_then(|h| Some((percentile(&h.own, 0.99)?, h.own.len())))
                .map_or_else(|| "—".into(), |(p99, n)| format!("{p99:.1} ms (of {n})"))
        });
        let _ = writeln!(
            out,
            "| endpoint change to maps p99, the other changes | {line} |"
        );
        let _ = writeln!(out);
    }
    let _ = writeln!(
        out,
        "Cells: the value, then **its ratio to raw** (the median over rounds) and the range of \
         the per-round ratios.\n"
    );
    let _ = writeln!(
        out,
        "![every figure against the number of services](e2e.svg)"
    );
    out
}

/// From this much, in one change, of both other tasks' CPU time on the
/// agent's CPUs and the agent's wait for a CPU, the machine held the agent off.
const HELD_OFF_MS: f64 = 1.0;

/// A datapath's changes split by whether the machine held the agent off.
struct HeldOff {
    /// The most other tasks ran, and the longest the agent waited, in one change, ms.
    max_taken: f64,
    max_waited: f64,
    /// Changes the machine held the agent off in.
    held: usize,
    of: usize,
    /// To maps, ms, of the other changes.
    own: Vec<f64>,
}

fn held_off(o: &Outcome) -> Option<HeldOff> {
    let times = &o.change_cpu_taken_ms;
    if times.is_empty() || times.len() != o.change_maps_ms.len() {
        return None;
    }
    let held = |(taken, waited): &(f64, f64)| *taken >= HELD_OFF_MS && *waited >= HELD_OFF_MS;
    Some(HeldOff {
        max_taken: times.iter().map(|t| t.0).fold(0.0, f64::max),
        max_waited: times.iter().map(|t| t.1).fold(0.0, f64::max),
        held: times.iter().filter(|t| held(t)).count(),
        of: times.len(),
        own: (o.change_maps_ms.iter().zip(times))
            .filter(|(_, t)| !held(t))
            .map(|(ms, _)| *ms)
            .collect(),
    })
}

/// One panel per figure (ratio to raw), then the start time and the
/// endpoint-change p50, against the number of services.
pub fn plot(
    path: &Path,
    scales: &[usize],
    datapaths: &[Datapath],
    outcomes: &[Vec<Outcome>],
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let raw = raw_index(datapaths);
    let root = SVGBackend::new(path, (1200, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((3, 3));
    let max_n = *scales.iter().max().unwrap_or(&1) as f64;
    let x_range = (1f64..max_n.max(10.0) * 1.5).log_scale();
    let colors = [BLACK, RED, BLUE, GREEN, MAGENTA, CYAN];
    // (title, y label, per datapath and scale the value, if any)
    type Series = Vec<Vec<Option<f64>>>;
    let mut plots: Vec<(String, &str, Series)> = FIGURES
        .iter()
        .map(|f| {
            let series = (0..datapaths.len())
                .map(|i| {
                    (0..scales.len())
                        .map(|k| ratio(&outcomes[k], raw, i, f.value).map(|r| r.0))
                        .collect()
                })
                .collect();
            let better = if f.higher_better { "higher" } else { "lower" };
            (format!("{} ({better} is better)", f.title), "÷ raw", series)
        })
        .collect();
    let control = |get: fn(&Outcome) -> Option<f64>| -> Series {
        (0..datapaths.len())
            .map(|i| (0..scales.len()).map(|k| get(&outcomes[k][i])).collect())
            .collect()
    };
    plots.push((
        "agent start to all programmed".into(),
        "seconds",
        control(|o| (!o.start_s.is_empty()).then(|| median(&o.start_s))),
    ));
    plots.push((
        "endpoint change to maps, p99".into(),
        "ms",
        control(|o| percentile(&o.change_maps_ms, 0.99)),
    ));
    plots.push((
        "endpoint change to packets, p50".into(),
        "ms",
        control(|o| percentile(&o.change_ms, 0.5)),
    ));
    plots.push(("agent RSS".into(), "MB", control(|o| o.rss_mb)));
    for (panel, (title, y_label, series)) in panels.iter().zip(plots) {
        let top = series
            .iter()
            .flatten()
            .flatten()
            .fold(0f64, |m, v| m.max(*v))
            .max(1e-3)
            * 1.2;
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 13))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(44)
            .build_cartesian_2d(x_range.clone(), 0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("services")
            .y_desc(y_label)
            .label_style(("sans-serif", 10))
            .draw()?;
        for (i, dp) in datapaths.iter().enumerate() {
            let color = colors[i % colors.len()];
            let points: Vec<(f64, f64)> = scales
                .iter()
                .zip(&series[i])
                .filter_map(|(&n, v)| v.map(|v| (n as f64, v)))
                .collect();
            if points.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(dp.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .label_font(("sans-serif", 10))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
