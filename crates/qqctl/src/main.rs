//! # qqctl: the command line for quorumq
//!
//! One process per command, one gRPC connection to one node (`--node`, any node: the node
//! forwards to the leader concerned). Every command maps onto one or a few `qq.v1.Broker` RPCs
//! through `qq-client`; nothing here knows about Raft.
//!
//! Output is meant for people: tables for lists, JSON for a single queue's full state. Errors
//! print `error: <CODE>: <message>` (the gRPC code as docs/api.md spells it) to stderr and exit 1,
//! so scripts can match on the code.
//!
//! **Typed `key=value` arguments** (`--arg`, `--header`): the value is a `long` when it parses
//! as an integer (`x-max-length=5`), a `bool` for `true` / `false`, and a string otherwise
//! (`x-overflow=reject-publish`). Quote a number to keep it a string: `x-match='"all"'` is not
//! needed for words, but `k='"42"'` sends the string `42`. `--definition` of `set-policy` is
//! JSON: integers become longs, other numbers doubles, arrays lists, objects tables.

mod cmd;
mod output;
mod typed;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use qq_client::{Client, TlsOptions};

use cmd::admin::{
    BindArgs, DeclareExchangeArgs, DeclareQueueArgs, DeleteExchangeArgs, DeleteQueueArgs,
    LimitsArgs, PutUserArgs, SetPermissionsArgs, SetPolicyArgs,
};
use cmd::browse::BrowseArgs;
use cmd::consume::{ConsumeArgs, GetArgs};
use cmd::definitions::DefinitionsCommand;
use cmd::moves::{MoveArgs, TaskArgs};
use cmd::publish::PublishArgs;
use cmd::{NameArgs, admin, browse, consume, definitions, moves, publish, status};

#[derive(Debug, Parser)]
#[command(
    name = "qqctl",
    version,
    about = "Command-line client for a quorumq cluster"
)]
struct Cli {
    /// Any node of the cluster (host:port, http://host:port or https://host:port).
    #[arg(long, global = true, env = "QQ_NODE", default_value = "127.0.0.1:7101")]
    node: String,
    /// User name; empty: send no credentials (such requests act as guest).
    #[arg(long, global = true, env = "QQ_USER", default_value = "guest")]
    user: String,
    /// Password.
    #[arg(long, global = true, env = "QQ_PASSWORD", default_value = "guest")]
    password: String,
    /// Virtual host (empty means /).
    #[arg(long, global = true, env = "QQ_VHOST", default_value = "")]
    vhost: String,
    /// CA certificate (PEM) of a node whose client port serves TLS: connect over https://.
    /// (--ca, --cert and --key go before the verb: `publish --key` is the routing key.)
    #[arg(long = "ca", id = "tls_ca", env = "QQ_CA")]
    ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM), for a node that requires one (its tls_client_ca); with --key.
    #[arg(long = "cert", id = "tls_cert", env = "QQ_CERT", requires = "tls_key")]
    cert: Option<std::path::PathBuf>,
    /// Key (PEM) of the client certificate.
    #[arg(long = "key", id = "tls_key", env = "QQ_KEY", requires = "tls_cert")]
    key: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// The verbs; each variant's doc comment is its `--help` text, its fields live with the verb in
/// `cmd::*`.
#[derive(Debug, Subcommand)]
enum Command {
    /// Declare an exchange.
    DeclareExchange(DeclareExchangeArgs),
    /// Delete an exchange.
    DeleteExchange(DeleteExchangeArgs),
    /// Declare a quorum queue.
    DeclareQueue(DeclareQueueArgs),
    /// Delete a queue.
    DeleteQueue(DeleteQueueArgs),
    /// Remove every ready message from a queue.
    Purge(NameArgs),
    /// Bind a queue to an exchange.
    Bind(BindArgs),
    /// Remove a binding.
    Unbind(BindArgs),
    /// Publish a message (or --count messages) and print the outcome.
    Publish(PublishArgs),
    /// Take one message. Default and --no-ack: print it and return it to the queue;
    /// --ack: take it for good.
    Get(GetArgs),
    /// Consume from a queue, printing each delivery; acks unless --reject, --requeue or
    /// --release.
    Consume(ConsumeArgs),
    /// Table of queues.
    ListQueues,
    /// One queue's full state, including its effective configuration, as JSON.
    Queue(NameArgs),
    /// Table of exchanges.
    ListExchanges,
    /// Table of bindings.
    ListBindings,
    /// Set a policy: e.g. set-policy limit '^jobs\.' --definition '{"max-length":5}'.
    SetPolicy(SetPolicyArgs),
    /// Remove a policy.
    ClearPolicy(NameArgs),
    /// Table of policies.
    ListPolicies,
    /// Bind an exchange to an exchange: bind-exchange DESTINATION SOURCE --key K.
    BindExchange(cmd::admin::ExchangeBindArgs),
    /// Remove an exchange-to-exchange binding.
    UnbindExchange(cmd::admin::ExchangeBindArgs),
    /// Set an operator policy (limits over the users' own, the stricter wins): e.g.
    /// set-operator-policy cap '.*' --definition '{"max-length":100000}'.
    SetOperatorPolicy(SetPolicyArgs),
    /// Remove an operator policy.
    ClearOperatorPolicy(NameArgs),
    /// Table of operator policies.
    ListOperatorPolicies,
    /// Create or update a user.
    PutUser(PutUserArgs),
    /// Delete a user.
    DeleteUser(NameArgs),
    /// Set a user's permissions on the vhost given with --vhost (default /); each is a regex.
    SetPermissions(SetPermissionsArgs),
    /// Create a vhost.
    PutVhost(NameArgs),
    /// Delete a vhost and everything in it.
    DeleteVhost(NameArgs),
    /// Set a vhost's limits: set-vhost-limits / '{"max-queues": 100, "max-connections": 50}'.
    SetVhostLimits(LimitsArgs),
    /// Set a user's limits: set-user-limits bob '{"max-connections": 5, "max-consumers": 20}'.
    SetUserLimits(LimitsArgs),
    /// Table of the vhost and user limits that are set.
    ListLimits,
    /// Nodes, metadata leader and queue leaders.
    Status,
    /// Cluster-wide counters.
    Overview,
    /// Show ready messages without taking them, with their x-death summary.
    Browse(BrowseArgs),
    /// Move messages to another queue, or each back to its x-first-death-queue (redrive).
    Move(MoveArgs),
    /// A move task's state and progress.
    MoveStatus(TaskArgs),
    /// Table of the vhost's move tasks.
    ListMoves,
    /// Cancel a running move task.
    CancelMove(TaskArgs),
    /// Export or import definitions (users, vhosts, permissions, exchanges, queues, bindings,
    /// policies) as one JSON document.
    #[command(subcommand)]
    Definitions(DefinitionsCommand),
    /// Add a node to a queue's replicas: add-member QUEUE NODE.
    AddMember(cmd::members::MemberArgs),
    /// Remove a node from a queue's replicas (never the last): delete-member QUEUE NODE.
    DeleteMember(cmd::members::MemberArgs),
    /// Add a node to every queue matching a regex: grow NODE [PATTERN].
    Grow(cmd::members::GrowArgs),
    /// Remove a node from every queue where it is not the last member: shrink NODE.
    Shrink(cmd::members::NodeArgs),
    /// Move queue leaders so each node leads about as many queues.
    Rebalance,
    /// Exit non-zero if stopping NODE now would break a queue's (or the metadata's) majority.
    CheckQuorumCritical(cmd::members::NodeArgs),
    /// Let a started, empty node join the cluster: join-node NODE ADDRESS CLUSTER_ADDRESS.
    JoinNode(cmd::members::JoinArgs),
    /// Forget a stopped node for good (its queue replicas are deleted first): forget-node NODE.
    ForgetNode(cmd::members::NodeArgs),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<qq_client::Error>() {
                Some(client_error) => eprintln!("error: {client_error}"),
                None => eprintln!("error: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let tls = if cli.ca.is_some() || cli.cert.is_some() || cli.node.starts_with("https://") {
        Some(TlsOptions::from_files(
            cli.ca.as_deref(),
            cli.cert.as_deref(),
            cli.key.as_deref(),
        )?)
    } else {
        None
    };
    let client = Client::connect_with(&cli.node, tls.as_ref()).await?;
    // An empty user sends no credentials: the node treats the request as guest's.
    let client = if cli.user.is_empty() {
        client
    } else {
        client.with_credentials(&cli.user, &cli.password)?
    }
    .with_vhost(&cli.vhost);
    let c = &client;
    match cli.command {
        Command::DeclareExchange(a) => admin::declare_exchange(c, a).await,
        Command::DeleteExchange(a) => admin::delete_exchange(c, a).await,
        Command::DeclareQueue(a) => admin::declare_queue(c, a).await,
        Command::DeleteQueue(a) => admin::delete_queue(c, a).await,
        Command::Purge(a) => admin::purge(c, a).await,
        Command::Bind(a) => admin::bind(c, a).await,
        Command::Unbind(a) => admin::unbind(c, a).await,
        Command::Publish(a) => publish::publish(c, a).await,
        Command::Get(a) => consume::get(c, a).await,
        Command::Consume(a) => consume::consume(c, a).await,
        Command::ListQueues => status::list_queues(c).await,
        Command::Queue(a) => status::queue(c, a).await,
        Command::ListExchanges => status::list_exchanges(c).await,
        Command::ListBindings => status::list_bindings(c).await,
        Command::SetPolicy(a) => admin::set_policy(c, a, false).await,
        Command::ClearPolicy(a) => admin::clear_policy(c, a, false).await,
        Command::ListPolicies => status::list_policies(c).await,
        Command::BindExchange(a) => admin::bind_exchange(c, a).await,
        Command::UnbindExchange(a) => admin::unbind_exchange(c, a).await,
        Command::SetOperatorPolicy(a) => admin::set_policy(c, a, true).await,
        Command::ClearOperatorPolicy(a) => admin::clear_policy(c, a, true).await,
        Command::ListOperatorPolicies => status::list_operator_policies(c).await,
        Command::PutUser(a) => admin::put_user(c, a).await,
        Command::DeleteUser(a) => admin::delete_user(c, a).await,
        Command::SetPermissions(a) => admin::set_permissions(c, a).await,
        Command::PutVhost(a) => admin::put_vhost(c, a).await,
        Command::DeleteVhost(a) => admin::delete_vhost(c, a).await,
        Command::SetVhostLimits(a) => admin::set_vhost_limits(c, a).await,
        Command::SetUserLimits(a) => admin::set_user_limits(c, a).await,
        Command::ListLimits => status::list_limits(c).await,
        Command::Status => status::status(c).await,
        Command::Overview => status::overview(c).await,
        Command::Browse(a) => browse::browse(c, a).await,
        Command::Move(a) => moves::start(c, a).await,
        Command::MoveStatus(a) => moves::status(c, a).await,
        Command::ListMoves => moves::list(c).await,
        Command::CancelMove(a) => moves::cancel(c, a).await,
        Command::Definitions(a) => definitions::run(c, a).await,
        Command::AddMember(a) => cmd::members::add_member(c, a).await,
        Command::DeleteMember(a) => cmd::members::delete_member(c, a).await,
        Command::Grow(a) => cmd::members::grow(c, a).await,
        Command::Shrink(a) => cmd::members::shrink(c, a).await,
        Command::Rebalance => cmd::members::rebalance(c).await,
        Command::CheckQuorumCritical(a) => cmd::members::check_quorum_critical(c, a).await,
        Command::JoinNode(a) => cmd::members::join_node(c, a).await,
        Command::ForgetNode(a) => cmd::members::forget_node(c, a).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_parses() {
        Cli::command().debug_assert();
    }

    /// Splits a documented command line the way a shell would for these examples: words, with
    /// single quotes grouping (no escapes inside them).
    fn words(line: &str) -> Vec<String> {
        let mut out = Vec::new();
        let (mut cur, mut quoted, mut any) = (String::new(), false, false);
        for ch in line.chars() {
            match ch {
                '\'' => (quoted, any) = (!quoted, true),
                c if c.is_whitespace() && !quoted => {
                    if any {
                        out.push(std::mem::take(&mut cur));
                    }
                    any = false;
                }
                c => (cur, any) = (cur + &c.to_string(), true),
            }
        }
        if any {
            out.push(cur);
        }
        out
    }

    fn parse(line: &str) -> Cli {
        Cli::try_parse_from(words(line)).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    /// The examples in README.md and cluster/up.sh, then one for every verb with every flag.
    const EXAMPLES: &[&str] = &[
        "qqctl declare-exchange orders --type topic",
        "qqctl declare-queue eu-orders --arg x-max-length=100000 --arg x-delivery-limit=5",
        "qqctl declare-queue eu-orders --arg x-max-length=1000",
        "qqctl bind eu-orders orders --key 'eu.#'",
        "qqctl publish --exchange orders --key eu.fr.new --body 'first order' --header source=web",
        "qqctl publish --exchange orders --key eu.de --count 2000 --size 256 --stream --window 256",
        "qqctl publish --exchange orders --key eu.fr.new --body hello",
        "qqctl list-queues",
        "qqctl queue eu-orders",
        "qqctl --node 127.0.0.1:7102 consume eu-orders --count 3",
        "qqctl --node 127.0.0.1:7102 consume eu-orders --count 1",
        "qqctl --node 127.0.0.1:7101 status",
        "qqctl status",
        "qqctl set-policy cap '^eu-' --definition '{\"max-length\": 5}'",
        "qqctl clear-policy cap",
        "qqctl consume eu-orders --count 1",
        // Every verb, every flag.
        "qqctl declare-exchange x --type headers --arg alternate-exchange=ae --internal",
        "qqctl delete-exchange x --if-unused",
        "qqctl delete-queue q --if-unused --if-empty",
        "qqctl purge q",
        "qqctl bind q x --key k --arg x-match=all --arg format=pdf",
        "qqctl unbind q x --key k --arg x-match=all",
        "qqctl publish --key q --body b --header a=1 --expiration 500 --mandatory --stream",
        "qqctl publish --key q --count 5 --size 16 --window 4",
        "qqctl get q --ack",
        "qqctl get q --no-ack",
        "qqctl consume q --prefetch 5 --count 2 --reject",
        "qqctl consume q --requeue",
        "qqctl consume q --release --count 1",
        "qqctl list-exchanges",
        "qqctl list-bindings",
        "qqctl set-policy limit '^jobs\\.' --definition '{\"max-length\":5}' --priority 3 --apply-to all",
        "qqctl list-policies",
        "qqctl put-user alice --new-password s3cret --tags administrator,monitoring",
        "qqctl delete-user alice",
        "qqctl --vhost v1 set-permissions alice --configure '^$' --write '.*' --read 'q.*'",
        "qqctl put-vhost v1",
        "qqctl delete-vhost v1",
        "qqctl overview",
        "qqctl set-vhost-limits shop '{\"max-queues\": 100, \"max-connections\": 50}'",
        "qqctl set-user-limits alice '{\"max-consumers\": 20}'",
        "qqctl list-limits",
        "qqctl list-queues --node n:1 --user u --password p --vhost v",
        "qqctl consume q --reject --reason 'missing customer id' --count 1",
        "qqctl consume q --requeue --delay-ms 5000 --count 1",
        "qqctl browse q --offset 10 --limit 5",
        "qqctl browse orders.dlq",
        "qqctl move orders.dlq --to orders --max 100 --rate 50",
        "qqctl move orders.dlq",
        "qqctl move-status 12.345",
        "qqctl list-moves",
        "qqctl cancel-move 12.345",
        "qqctl declare-queue orders --arg x-dead-letter-exchange= --arg x-dead-letter-routing-key=orders.dlq --arg x-requeue-delays=[1000,10000] --arg x-delivery-limit=3",
        "qqctl consume orders --count 1 --reject --reason 'missing customer id'",
        "qqctl consume orders --count 1 --requeue --delay-ms 30000",
        "qqctl declare-queue jobs --arg x-requeue-delays=[1000,10000,60000] --arg x-delivery-limit=5",
        "qqctl publish --key eu-orders --count 100 --publisher-id batch-42",
        "qqctl check-quorum-critical 3",
        "qqctl add-member eu-orders 3",
        "qqctl delete-member eu-orders 3",
        "qqctl grow 3 '^eu-'",
        "qqctl shrink 3",
        "qqctl rebalance",
        "qqctl declare-queue local --arg x-queue-leader-locator=client-local",
        "qqctl definitions export --file defs.json",
        "qqctl definitions import defs.json",
        "qqctl join-node 4 127.0.0.1:7104 127.0.0.1:7204",
        "qqctl grow 4 '.*'",
        "qqctl forget-node 4",
        "qqctl bind-exchange audit orders --key 'eu.#' --arg x-match=all",
        "qqctl unbind-exchange audit orders --key 'eu.#'",
        "qqctl set-operator-policy cap '.*' --definition '{\"max-length\": 100000}' --priority 1 --apply-to quorum_queues",
        "qqctl clear-operator-policy cap",
        "qqctl list-operator-policies",
    ];

    #[test]
    fn documented_examples_parse_and_cover_every_verb() {
        let mut covered = std::collections::BTreeSet::new();
        for line in EXAMPLES {
            parse(line);
            let matches = Cli::command().get_matches_from(words(line));
            covered.insert(matches.subcommand_name().unwrap().to_string());
        }
        let verbs: std::collections::BTreeSet<String> = Cli::command()
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        let missing: Vec<_> = verbs.difference(&covered).collect();
        assert!(missing.is_empty(), "verbs without an example: {missing:?}");
    }

    #[test]
    fn examples_carry_their_values() {
        let s = format!("{:?}", parse(EXAMPLES[5]).command);
        for want in [
            "count: Some(2000)",
            "size: 256",
            "stream: true",
            "window: 256",
        ] {
            assert!(s.contains(want), "{s} lacks {want}");
        }
        let c = parse("qqctl put-user alice --new-password pw --tags administrator,monitoring");
        let s = format!("{:?}", c.command);
        assert!(
            s.contains(r#"tags: ["administrator", "monitoring"]"#),
            "{s}"
        );
        // Regression: the grantee of set-permissions is not the caller (--user).
        let c = parse("qqctl --vhost shop set-permissions alice --configure '^a'");
        assert_eq!(c.user, "guest", "the caller stays the default user");
        assert!(format!("{:?}", c.command).contains(r#"grantee: "alice""#));
        let c = parse("qqctl list-queues --node n:1 --user u --password p --vhost v");
        assert_eq!(
            (c.node, c.user, c.password, c.vhost),
            ("n:1".into(), "u".into(), "p".into(), "v".into())
        );
    }

    #[test]
    fn defaults_are_unchanged() {
        let expect = [
            ("declare-exchange x", "kind: Direct"),
            ("bind q x", r#"key: """#),
            (
                "publish --key k",
                r#"exchange: "", key: "k", body: None, count: None, size: 64"#,
            ),
            (
                "publish --key k",
                "mandatory: false, stream: false, window: 256",
            ),
            (
                "consume q",
                "prefetch: 10, count: None, reject: false, requeue: false",
            ),
            ("get q", "ack: false, no_ack: false"),
            (
                "set-policy p x --definition {}",
                r#"priority: 0, apply_to: "queues""#,
            ),
            (
                "set-permissions u",
                r#"configure: ".*", write: ".*", read: ".*""#,
            ),
            ("put-user u --new-password p", "tags: []"),
        ];
        for (line, want) in expect {
            let s = format!("{:?}", parse(&format!("qqctl {line}")).command);
            assert!(s.contains(want), "{line}: {s} lacks {want}");
        }
    }

    #[test]
    fn global_options_keep_their_env_and_defaults() {
        let cmd = Cli::command();
        for (id, env, default) in [
            ("node", "QQ_NODE", "127.0.0.1:7101"),
            ("user", "QQ_USER", "guest"),
            ("password", "QQ_PASSWORD", "guest"),
            ("vhost", "QQ_VHOST", ""),
        ] {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            assert!(arg.is_global_set(), "{id}");
            assert_eq!(arg.get_env().unwrap(), env, "{id}");
            assert_eq!(arg.get_default_values(), [default], "{id}");
        }
    }

    #[test]
    fn conflicting_flags_are_refused() {
        for line in [
            "qqctl get q --ack --no-ack",
            "qqctl consume q --reject --requeue",
            "qqctl consume q --reason why",
            "qqctl consume q --delay-ms 5",
            "qqctl consume q --reject --delay-ms 5",
            "qqctl consume q --requeue --reason why",
            "qqctl publish --key k --body b --count 2",
            "qqctl publish --key k --body b --size 2",
            "qqctl set-policy p x --definition {} --apply-to bogus",
            "qqctl declare-exchange x --type bogus",
        ] {
            assert!(Cli::try_parse_from(words(line)).is_err(), "{line}");
        }
    }
}
