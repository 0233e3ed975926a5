//! Placeholder, replaced by the benchmark implementation.
use anyhow::{Result, bail};

#[derive(clap::Args)]
pub struct BenchArgs {}

#[derive(clap::Args)]
pub struct ChurnArgs {}

pub fn run(_: &BenchArgs) -> Result<()> {
    bail!("not written yet")
}

pub fn churn(_: &ChurnArgs) -> Result<()> {
    bail!("not written yet")
}
