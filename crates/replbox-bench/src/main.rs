//! `replbox-bench`: measure the built `replbox` binary on this machine, through its MCP
//! interface as a client drives it, against the floor of what it does, and print medians,
//! p10, p90 and ratios (or JSON). It is no part of the product: the server only ever runs
//! as its own binary here.
//!
//! Modules: `sections` (what is measured, and the run), `client` (a stdio MCP server under
//! measurement), `floor` (the same work without replbox), `langs` (the per-language table),
//! `report` (statistics, targets, the table), `server` (finding the binary measured).

mod client;
mod floor;
mod langs;
mod report;
mod sections;
mod server;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use crate::sections::BenchArgs;

#[derive(Parser)]
#[command(
    name = "replbox-bench",
    version,
    about = "Measure the replbox binary on this machine (run-code and sessions through MCP \
             against the interpreters driven directly, server start, memory, a soak) and \
             print medians, p10, p90 and ratios"
)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // stdout carries the report: logs go to stderr.
    let filter = tracing_subscriber::EnvFilter::try_from_env("REPLBOX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(filter)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("replbox-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(bench(cli.args));
    // Do not wait for stray blocking tasks at exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("replbox-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let json = args.json;
    let report = sections::run(args).await?;
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        report::print_table(&report, &mut out)?;
    }
    Ok(())
}
