//! The churn's routes: how a cycle's messages reach its queue, and how that route is taken
//! down again, so that exchanges and bindings are declared and deleted under the faults too.
//!
//! Cycle `n` routes by `n mod 4` (a short run of two cycles sees the first two kinds):
//! - 0: the default exchange (the queue's name as routing key);
//! - 1: a fanout exchange `sim.churn.src.<n>` bound to a topic exchange `sim.churn.x.<n>` (an
//!   exchange-to-exchange binding), which is bound to the queue with `sim.<n>.#`, published
//!   to; the source is deleted and its binding must go with it (read back), then the topic
//!   exchange (with its queue binding), then the queue;
//! - 2: a direct exchange `sim.churn.x.<n>`, bound with key `k<n>`; after the count the
//!   binding is removed and read back as gone, then the exchange is deleted with `if_unused`
//!   (refused while a binding is left) and read back as gone, before the queue is deleted;
//! - 3: a topic exchange bound with `sim.<n>.#`, published to with `sim.<n>.m`; the queue is
//!   deleted first, its binding must go with it (read back), then the exchange is deleted with
//!   `if_unused`.
//!
//! Publishes stay mandatory: a node that finds no route for a publish after its bindings
//! were committed routed by a stale view, and the cycle fails as for the default exchange.
//! Every step goes through [`step`] (retried through the next node while the cluster cannot
//! serve it); NOT_FOUND for a delete or unbind that a lost answer already did counts as done.

use std::collections::HashMap;

use qq_client::Client;

use crate::steps::{done_if_gone, step, still_there};

/// How cycle `n` routes its messages.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Route {
    Default,
    Direct,
    Topic,
    ExchangeToExchange,
}

impl Route {
    pub fn of_cycle(n: u64) -> Route {
        match n % 4 {
            0 => Route::Default,
            1 => Route::ExchangeToExchange,
            2 => Route::Direct,
            _ => Route::Topic,
        }
    }
}

fn exchange(n: u64) -> String {
    format!("sim.churn.x.{n}")
}

fn source(n: u64) -> String {
    format!("sim.churn.src.{n}")
}

/// The binding key of the queue to its exchange.
fn binding_key(route: Route, n: u64) -> String {
    match route {
        Route::Direct => format!("k{n}"),
        _ => format!("sim.{n}.#"),
    }
}

/// Declares the route's exchanges and bindings; returns the exchange and routing key to
/// publish with.
pub async fn build(
    clients: &[Client],
    n: u64,
    q: &str,
    route: Route,
) -> Result<(String, String), String> {
    let x = exchange(n);
    let kind = match route {
        Route::Default => return Ok((String::new(), q.to_string())),
        Route::Direct => "direct",
        Route::Topic | Route::ExchangeToExchange => "topic",
    };
    step(clients, n, "declare exchange", |c| {
        let x = x.clone();
        async move { c.declare_exchange(&x, kind).await }
    })
    .await?;
    let key = binding_key(route, n);
    step(clients, n, "bind", |c| {
        let (x, key) = (x.clone(), key.clone());
        async move { c.bind(q, &x, &key, HashMap::new()).await }
    })
    .await?;
    let publish_key = match route {
        Route::Direct => key,
        _ => format!("sim.{n}.m"),
    };
    if route != Route::ExchangeToExchange {
        return Ok((x, publish_key));
    }
    let src = source(n);
    step(clients, n, "declare source exchange", |c| {
        let src = src.clone();
        async move { c.declare_exchange(&src, "fanout").await }
    })
    .await?;
    step(clients, n, "bind exchange to exchange", |c| {
        let (x, src) = (x.clone(), src.clone());
        async move { c.bind_exchange(&x, &src, "", HashMap::new()).await }
    })
    .await?;
    Ok((src, publish_key))
}

/// Takes down what must go before the queue is deleted.
pub async fn before_queue_delete(
    clients: &[Client],
    n: u64,
    q: &str,
    route: Route,
) -> Result<(), String> {
    let x = exchange(n);
    match route {
        Route::Default | Route::Topic => Ok(()),
        Route::Direct => {
            let key = binding_key(route, n);
            step(clients, n, "unbind", |c| {
                let (x, key) = (x.clone(), key.clone());
                async move { done_if_gone(c.unbind(q, &x, &key, HashMap::new()).await) }
            })
            .await?;
            binding_gone(clients, n, &x, q).await?;
            delete_exchange(clients, n, &x, true).await
        }
        Route::ExchangeToExchange => {
            let src = source(n);
            delete_exchange(clients, n, &src, false).await?;
            binding_gone(clients, n, &src, &x).await?;
            delete_exchange(clients, n, &x, false).await?;
            binding_gone(clients, n, &x, q).await
        }
    }
}

/// Takes down what must go after the queue is deleted.
pub async fn after_queue_delete(
    clients: &[Client],
    n: u64,
    q: &str,
    route: Route,
) -> Result<(), String> {
    if route != Route::Topic {
        return Ok(());
    }
    let x = exchange(n);
    binding_gone(clients, n, &x, q).await?;
    delete_exchange(clients, n, &x, true).await
}

/// Deletes `x`, then reads the exchanges until it is not listed.
async fn delete_exchange(
    clients: &[Client],
    n: u64,
    x: &str,
    if_unused: bool,
) -> Result<(), String> {
    step(clients, n, "delete exchange", |c| async move {
        done_if_gone(c.delete_exchange(x, if_unused).await)
    })
    .await?;
    step(
        clients,
        n,
        "read back the exchange's delete",
        |c| async move {
            let listed = c.list_exchanges().await?.iter().any(|e| e.name == x);
            still_there(listed, x)
        },
    )
    .await
}

/// Reads the bindings until none goes from `source` to `destination` (a node's view of the
/// metadata may trail a change for a moment; still there after the step's limit fails).
async fn binding_gone(
    clients: &[Client],
    n: u64,
    source: &str,
    destination: &str,
) -> Result<(), String> {
    let what = format!("{source} -> {destination}");
    step(clients, n, "read back the binding's removal", |c| {
        let what = what.clone();
        async move {
            let listed = c.list_bindings().await?.iter().any(|b| {
                b.exchange == source && (b.destination == destination || b.queue == destination)
            });
            still_there(listed, &what)
        }
    })
    .await
}
