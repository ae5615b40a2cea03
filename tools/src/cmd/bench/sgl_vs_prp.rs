//! Being written (issue 8); replaced by the real benchmark before the issue is resolved.

#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_args: &Args) -> anyhow::Result<()> {
    anyhow::bail!("this benchmark is not built yet")
}
