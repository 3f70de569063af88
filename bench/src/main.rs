//! `sessionfs-bench`: the benchmark's logic (corpora, timing, reports).
//! The scripts under `scripts/bench/` drive it; see docs/benchmarks.md.

mod corpus;
mod serve;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use clap::{Parser, Subcommand};
use serde::{Deserialize, Serialize};

#[derive(Parser)]
#[command(about = "sessionfs benchmark helper: corpora, timing, reports")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate a corpus deterministically from a seed.
    Corpus {
        /// s (source tree), b (big files) or m (many entries).
        #[arg(long)]
        kind: String,
        /// Where (must not exist).
        #[arg(long)]
        out: PathBuf,
        /// Files (s), files (b) or entries (m).
        #[arg(long)]
        count: Option<u64>,
        /// Bytes per file (b).
        #[arg(long, default_value_t = 1 << 30)]
        size: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Time a shell command: `warmup` unrecorded runs, then `runs` recorded
    /// ones (each after `prepare`, untimed). Appends one JSON line to `--out`.
    Measure {
        /// Workload name, e.g. `pack S`.
        #[arg(long)]
        name: String,
        /// Tool name, e.g. `sessionfs`, `tar | sha256sum`.
        #[arg(long)]
        tool: String,
        /// The command (run with `bash -c`).
        #[arg(long)]
        cmd: String,
        /// Run before each timed run, untimed (e.g. drop caches).
        #[arg(long)]
        prepare: Option<String>,
        /// Run after each run, untimed (e.g. unmount).
        #[arg(long)]
        cleanup: Option<String>,
        #[arg(long, default_value_t = 1)]
        warmup: u32,
        #[arg(long, default_value_t = 5)]
        runs: u32,
        /// Bytes processed per run, for throughput.
        #[arg(long)]
        bytes: Option<u64>,
        /// JSON-lines file to append to.
        #[arg(long)]
        out: PathBuf,
    },
    /// Record a value measured by the script itself (bytes, KiB of RSS,
    /// seconds of a one-off step). Appends one JSON line to `--out`.
    Record {
        #[arg(long)]
        name: String,
        #[arg(long)]
        tool: String,
        /// One value per run.
        #[arg(long, num_args = 1.., required = true)]
        value: Vec<f64>,
        /// `s`, `B`, `MiB`, ...
        #[arg(long, default_value = "s")]
        unit: String,
        /// What the command was, for the report.
        #[arg(long, default_value = "")]
        cmd: String,
        #[arg(long)]
        out: PathBuf,
    },
    /// Serve a directory over HTTP with range requests, shaped like an
    /// object store in region (see serve.rs); runs until killed.
    Serve {
        /// The directory whose files are served.
        #[arg(long)]
        root: PathBuf,
        /// Milliseconds before each response's first byte.
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
        /// Megabits per second for all connections together (0: no cap).
        #[arg(long, default_value_t = 0)]
        mbit: u64,
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Where to write the port it listens on.
        #[arg(long)]
        port_file: PathBuf,
    },
    /// Download an object with parallel ranged GETs (the download peer).
    Download {
        url: String,
        out: PathBuf,
        #[arg(long, default_value_t = 8)]
        threads: usize,
        #[arg(long, default_value_t = 8 << 20)]
        part: u64,
    },
    /// Upload a file as a multipart upload with parallel parts to `serve`
    /// (the upload peer).
    Upload {
        file: PathBuf,
        url: String,
        #[arg(long, default_value_t = 8)]
        threads: usize,
        #[arg(long, default_value_t = 8 << 20)]
        part: u64,
    },
    /// Render JSON-lines results as markdown tables, one per workload, with
    /// ratios against the tool named by `--baseline` (when the workload has
    /// it) and sessionfs against every other tool. `--chart` also writes a
    /// gnuplot data file of the ratios to the baseline.
    Report {
        results: PathBuf,
        #[arg(long, default_value = "native")]
        baseline: String,
        #[arg(long)]
        chart: Option<PathBuf>,
    },
}

#[derive(Serialize, Deserialize)]
struct Measurement {
    name: String,
    tool: String,
    cmd: String,
    runs: Vec<f64>,
    median: f64,
    min: f64,
    max: f64,
    bytes: Option<u64>,
    #[serde(default = "seconds")]
    unit: String,
    /// Run before each timed run, untimed (listed with the command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prepare: Option<String>,
}

fn seconds() -> String {
    "s".into()
}

impl Measurement {
    fn new(name: String, tool: String, cmd: String, runs: Vec<f64>, unit: String) -> Self {
        let mut sorted = runs.clone();
        Measurement {
            median: median(&mut sorted),
            min: sorted.first().copied().unwrap_or(0.0),
            max: sorted.last().copied().unwrap_or(0.0),
            name,
            tool,
            cmd,
            runs,
            bytes: None,
            unit,
            prepare: None,
        }
    }

    fn append(&self, out: &std::path::Path) -> std::io::Result<()> {
        eprintln!(
            "{:<34} {:<28} median {:.3} {} (min {:.3}, max {:.3})",
            self.name, self.tool, self.median, self.unit, self.min, self.max
        );
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)?;
        writeln!(f, "{}", serde_json::to_string(self)?)
    }

    /// The median, printed in its unit.
    fn show(&self, v: f64) -> String {
        match self.unit.as_str() {
            "s" if v < 1.0 => format!("{:.1} ms", v * 1e3),
            "s" => format!("{v:.2} s"),
            "B" => format!("{v:.0} B"),
            u => format!("{v:.1} {u}"),
        }
    }
}

fn sh(cmd: &str) -> std::io::Result<()> {
    // bash, not sh: scripts export functions for the commands to call.
    let st = Command::new("bash")
        .arg("-c")
        .arg(cmd)
        .stdout(std::process::Stdio::null())
        .status()?;
    if st.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("`{cmd}` failed: {st}")))
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A gnuplot data file: one row per workload, one column per tool (in the
/// order tools first appear), `NaN` where a tool did not run the workload.
fn pivot(rows: &[(String, String, f64)]) -> String {
    let mut tools: Vec<&str> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for (n, t, _) in rows {
        if !tools.contains(&t.as_str()) {
            tools.push(t);
        }
        if !names.contains(&n.as_str()) {
            names.push(n);
        }
    }
    let mut out = String::from("workload");
    for t in &tools {
        out.push_str(&format!("\t\"{t}\""));
    }
    out.push('\n');
    for n in names {
        out.push_str(&format!("\"{n}\""));
        for t in &tools {
            match rows.iter().find(|(rn, rt, _)| rn == n && rt == t) {
                Some((_, _, v)) => out.push_str(&format!("\t{v:.4}")),
                None => out.push_str("\tNaN"),
            }
        }
        out.push('\n');
    }
    out
}

/// With `BENCH_RESUME=1`, whether `out` already holds a result for this
/// workload and tool (an interrupted run measures only what it lacks).
fn already_measured(out: &std::path::Path, name: &str, tool: &str) -> bool {
    if std::env::var_os("BENCH_RESUME").is_none_or(|v| v != "1") {
        return false;
    }
    let found = std::fs::read_to_string(out).is_ok_and(|text| {
        text.lines()
            .filter_map(|l| serde_json::from_str::<Measurement>(l).ok())
            .any(|m| m.name == name && m.tool == tool)
    });
    if found {
        eprintln!("{name:<34} {tool:<28} kept from the interrupted run");
    }
    found
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sessionfs-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> std::io::Result<()> {
    match cli.cmd {
        Cmd::Corpus {
            kind,
            out,
            count,
            size,
            seed,
        } => {
            if out.exists() {
                return Err(std::io::Error::other(format!("{} exists", out.display())));
            }
            let tmp = out.with_extension("partial");
            let _ = std::fs::remove_dir_all(&tmp);
            match kind.as_str() {
                "s" => corpus::source_tree(&tmp, count.unwrap_or(100_000), seed)?,
                "b" => corpus::big_files(&tmp, count.unwrap_or(3), size, seed)?,
                "m" => corpus::many_entries(&tmp, count.unwrap_or(250_000), seed)?,
                other => {
                    return Err(std::io::Error::other(format!(
                        "unknown corpus kind {other}"
                    )));
                }
            }
            std::fs::rename(&tmp, &out)
        }
        Cmd::Serve {
            root,
            latency_ms,
            mbit,
            port,
            port_file,
        } => serve::serve(
            &root,
            serve::Shape {
                latency: std::time::Duration::from_millis(latency_ms),
                rate: mbit * 1_000_000 / 8,
            },
            port,
            &port_file,
        ),
        Cmd::Download {
            url,
            out,
            threads,
            part,
        } => serve::download(&url, &out, threads.max(1), part.max(1)).map(|_| ()),
        Cmd::Upload {
            file,
            url,
            threads,
            part,
        } => serve::upload(&file, &url, threads.max(1), part.max(1)),
        Cmd::Measure {
            name,
            tool,
            cmd,
            prepare,
            cleanup,
            warmup,
            runs,
            bytes,
            out,
        } => {
            if already_measured(&out, &name, &tool) {
                return Ok(());
            }
            for _ in 0..warmup {
                if let Some(p) = &prepare {
                    sh(p)?;
                }
                sh(&cmd)?;
                if let Some(c) = &cleanup {
                    sh(c)?;
                }
            }
            let mut times = Vec::new();
            for _ in 0..runs {
                if let Some(p) = &prepare {
                    sh(p)?;
                }
                let t = Instant::now();
                sh(&cmd)?;
                times.push(t.elapsed().as_secs_f64());
                if let Some(c) = &cleanup {
                    sh(c)?;
                }
            }
            let mut m = Measurement::new(name, tool, cmd, times, seconds());
            m.bytes = bytes;
            m.prepare = prepare;
            m.append(&out)
        }
        Cmd::Record {
            name,
            tool,
            value,
            unit,
            cmd,
            out,
        } => {
            if already_measured(&out, &name, &tool) {
                return Ok(());
            }
            Measurement::new(name, tool, cmd, value, unit).append(&out)
        }
        Cmd::Report {
            results,
            baseline,
            chart,
        } => {
            let text = std::fs::read_to_string(results)?;
            let all: Vec<Measurement> = text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            let mut names: Vec<&str> = Vec::new();
            for m in &all {
                if !names.contains(&m.name.as_str()) {
                    names.push(&m.name);
                }
            }
            // Ratios to the baseline, for the chart: (workload, tool, ratio).
            let mut chart_rows: Vec<(String, String, f64)> = Vec::new();
            for name in names {
                let rows: Vec<&Measurement> = all.iter().filter(|m| m.name == name).collect();
                let base = rows.iter().find(|m| m.tool == baseline);
                let is_ours = |t: &str| t == "sessionfs" || t.starts_with("sessionfs,");
                let ours = rows.iter().find(|m| is_ours(&m.tool));
                println!("### {name}\n");
                println!(
                    "| tool | median | min-max | runs | throughput | x {baseline} | sessionfs ÷ this |"
                );
                println!("|---|---|---|---|---|---|---|");
                for m in &rows {
                    let ratio = |a: f64, b: f64| {
                        if b > 0.0 {
                            format!("{:.2}", a / b)
                        } else {
                            "-".into()
                        }
                    };
                    let vs_base = base.map_or("-".into(), |b| ratio(m.median, b.median));
                    let vs_ours = match ours {
                        Some(o) if !is_ours(&m.tool) => ratio(o.median, m.median),
                        _ => "-".into(),
                    };
                    let tput = m.bytes.map_or(String::from("-"), |b| {
                        format!("{:.0} MB/s", b as f64 / m.median / 1e6)
                    });
                    println!(
                        "| {} | {} | {} – {} | {} | {} | {} | {} |",
                        m.tool.replace('|', "\\|"),
                        m.show(m.median),
                        m.show(m.min),
                        m.show(m.max),
                        m.runs.len(),
                        tput,
                        vs_base,
                        vs_ours
                    );
                    if let Some(b) = base
                        && b.median > 0.0
                        && m.tool != baseline
                        && m.unit == "s"
                    {
                        chart_rows.push((name.to_owned(), m.tool.clone(), m.median / b.median));
                    }
                }
                println!();
            }
            if let Some(path) = chart {
                std::fs::write(path, pivot(&chart_rows))?;
            }
            Ok(())
        }
    }
}
