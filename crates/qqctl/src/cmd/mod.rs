//! One async function per `qqctl` verb, grouped by what it touches; each takes the connected
//! client and the verb's parsed arguments.

use clap::Args;

pub mod admin;
pub mod browse;
pub mod consume;
pub mod definitions;
pub mod members;
pub mod moves;
pub mod publish;
pub mod status;

// No doc comment here: clap would take it for the verb's help text.
#[derive(Debug, Args)]
pub struct NameArgs {
    pub name: String,
}
