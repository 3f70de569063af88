//! `sessionfs-bench`: the benchmark's logic (corpora, timing, reports).
//! The scripts under `scripts/bench/` drive it; see docs/benchmarks.md.

mod corpus;

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
        /// The command (run with `sh -c`).
        #[arg(long)]
        cmd: String,
        /// Run before each timed run, untimed (e.g. drop caches).
        #[arg(long)]
        prepare: Option<String>,
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
    /// Render JSON-lines results as a markdown table, with ratios against
    /// the tool named by `--baseline` in each workload.
    Report {
        results: PathBuf,
        #[arg(long)]
        baseline: Option<String>,
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
}

fn sh(cmd: &str) -> std::io::Result<()> {
    let st = Command::new("sh")
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
        Cmd::Measure {
            name,
            tool,
            cmd,
            prepare,
            warmup,
            runs,
            bytes,
            out,
        } => {
            for _ in 0..warmup {
                if let Some(p) = &prepare {
                    sh(p)?;
                }
                sh(&cmd)?;
            }
            let mut times = Vec::new();
            for _ in 0..runs {
                if let Some(p) = &prepare {
                    sh(p)?;
                }
                let t = Instant::now();
                sh(&cmd)?;
                times.push(t.elapsed().as_secs_f64());
            }
            let mut sorted = times.clone();
            let m = Measurement {
                median: median(&mut sorted),
                min: sorted.first().copied().unwrap_or(0.0),
                max: sorted.last().copied().unwrap_or(0.0),
                name,
                tool,
                cmd,
                runs: times,
                bytes,
            };
            eprintln!(
                "{:<28} {:<24} median {:.3}s (min {:.3}, max {:.3})",
                m.name, m.tool, m.median, m.min, m.max
            );
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(out)?;
            writeln!(f, "{}", serde_json::to_string(&m)?)
        }
        Cmd::Report { results, baseline } => {
            let text = std::fs::read_to_string(results)?;
            let all: Vec<Measurement> = text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            println!("| workload | tool | median | min-max | throughput | ratio |");
            println!("|---|---|---|---|---|---|");
            for m in &all {
                let base = baseline
                    .as_ref()
                    .and_then(|b| all.iter().find(|x| x.name == m.name && &x.tool == b));
                let ratio = base.map_or(String::from("-"), |b| {
                    format!("{:.2}x", m.median / b.median)
                });
                let tput = m.bytes.map_or(String::from("-"), |b| {
                    format!("{:.0} MB/s", b as f64 / m.median / 1e6)
                });
                println!(
                    "| {} | {} | {:.3} s | {:.3}-{:.3} s | {} | {} |",
                    m.name, m.tool, m.median, m.min, m.max, tput, ratio
                );
            }
            Ok(())
        }
    }
}
