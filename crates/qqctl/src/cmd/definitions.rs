//! `definitions export [--file F]` and `definitions import FILE`: the cluster's topology as one
//! JSON document in RabbitMQ's layout (administrators only). Import checks the whole document
//! first and changes nothing if any part is refused; then it creates what is missing and
//! prints, per kind, what was created, updated and already there.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use qq_client::Client;

#[derive(Debug, Subcommand)]
pub enum DefinitionsCommand {
    /// Print the definitions document (or write it to --file).
    Export(ExportArgs),
    /// Import a definitions document (as export writes it, or RabbitMQ's where it fits).
    Import(ImportArgs),
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Write to this file instead of stdout.
    #[arg(long)]
    file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The JSON document (`-` reads stdin).
    file: PathBuf,
}

pub async fn run(client: &Client, command: DefinitionsCommand) -> anyhow::Result<()> {
    match command {
        DefinitionsCommand::Export(a) => {
            let json = client.export_definitions().await?;
            match a.file {
                Some(path) => {
                    std::fs::write(&path, format!("{json}\n"))
                        .map_err(|e| anyhow::anyhow!("write {}: {e}", path.display()))?;
                    eprintln!("definitions written to {}", path.display());
                }
                None => println!("{json}"),
            }
        }
        DefinitionsCommand::Import(a) => {
            let json = if a.file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&a.file)
                    .map_err(|e| anyhow::anyhow!("read {}: {e}", a.file.display()))?
            };
            let counts = client.import_definitions(&json).await?;
            println!(
                "{:<22} {:>8} {:>8} {:>10}",
                "kind", "created", "updated", "unchanged"
            );
            for c in counts {
                println!(
                    "{:<22} {:>8} {:>8} {:>10}",
                    c.kind, c.created, c.updated, c.unchanged
                );
            }
        }
    }
    Ok(())
}
