//! Failover and restart with many queues (steps 4 and 8 of scenario 12): `kill -9` of the
//! node leading the most queues, the time until every queue is led elsewhere, then its
//! restart and the time until it serves and its replicas have caught up. How leaders and
//! applied indexes are read, on each system, is in the module doc of `scale`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{FAILOVER_DEADLINE, POLL, PREFIX, STALE, missing};
use crate::System;
use crate::cluster::{Cluster, NODES};
use crate::driver::qq_address;
use crate::erl_loop::{ErlLoop, rabbit_node};
use crate::load::Progress;
use crate::scenarios::{Better, Outcome, Settings};

async fn qq_status(node: usize) -> Result<qq_client::ClusterStatusResponse> {
    let ask = async {
        let c = qq_client::Client::connect(&qq_address(node)).await?;
        anyhow::Ok(c.cluster_status().await?)
    };
    tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .context("ClusterStatus timed out")?
}

/// Erlang: `Names`, the Ra cluster names of the scenario's queues (the same on every node).
const RABBIT_NAMES: &str = r#"Names = [element(1, amqqueue:get_pid(Q)) || Q <- rabbit_amqqueue:list(<<"/">>),
    lists:prefix("bench-scale-", binary_to_list(element(4, amqqueue:get_name(Q))))],
Set = sets:from_list(Names),
LedOn = fun(N) ->
    case rpc:call(N, ets, tab2list, [ra_state], 2000) of
        L when is_list(L) -> sets:intersection(Set, sets:from_list([Nm || {Nm, leader} <- L]));
        _ -> sets:new()
    end
end,"#;

fn erl_nodes(nodes: &[usize]) -> String {
    let names: Vec<String> = nodes
        .iter()
        .map(|n| format!("'{}'", rabbit_node(*n)))
        .collect();
    format!("[{}]", names.join(", "))
}

/// Queues each node leads by its own account.
async fn leaders_per_node(cl: &Cluster) -> Result<[usize; NODES]> {
    let mut per = [0usize; NODES];
    match cl.system() {
        System::Quorumq | System::QuorumqAmqp => {
            for (n, count) in per.iter_mut().enumerate() {
                let st = qq_status(n).await?;
                *count = st
                    .queues
                    .iter()
                    .filter(|q| q.name.starts_with(PREFIX) && q.leader == n as u64 + 1)
                    .count();
            }
        }
        System::Rabbitmq => {
            let expr = format!(
                "{RABBIT_NAMES}\nlists:flatten([io_lib:format(\"~b \", [sets:size(LedOn(N))]) || N <- {}]).",
                erl_nodes(&[0, 1, 2])
            );
            let said = cl.rabbitmqctl(0, &["eval", &expr])?;
            let v: Vec<usize> = said
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|x| x.parse().ok())
                .collect();
            if v.len() != NODES {
                bail!("leaders per node: unexpected answer {said}");
            }
            per.copy_from_slice(&v);
        }
    }
    Ok(per)
}

/// What a failover and restart of one node measured.
pub(super) struct Restart {
    victim: usize,
    led_before: [usize; NODES],
    failover_s: Option<f64>,
    led_at_end: usize,
    serves_s: Option<f64>,
    caught_up_s: Option<f64>,
    caught_up: usize,
    members: usize,
}

/// Polls `led` (how many of `total` are led, `None` when unreadable) every [`POLL`] until all
/// are or `deadline` passes; the time and the last count.
async fn wait_all(
    label: String,
    deadline: Duration,
    total: usize,
    mut led: impl AsyncFnMut() -> Option<usize>,
) -> (Option<f64>, usize) {
    let start = Instant::now();
    let seen = Arc::new(AtomicUsize::new(0));
    let progress = {
        let seen = seen.clone();
        Progress::lines(label, move || {
            format!("{} of {total}", seen.load(Ordering::Relaxed))
        })
    };
    let mut last = 0;
    let result = loop {
        if let Some(n) = led().await {
            last = n;
            seen.store(n, Ordering::Relaxed);
            if n >= total {
                break Some(start.elapsed().as_secs_f64());
            }
        }
        if start.elapsed() > deadline {
            break None;
        }
        tokio::time::sleep(POLL).await;
    };
    progress.finish().await;
    (result, last)
}

/// `kill -9` the node leading the most of `names`, time the failover, start it again and time

/// `kill -9` the node leading the most of `names`, time the failover, start it again and time
/// until it serves and its replicas have caught up.
pub(super) async fn failover_and_restart(
    cl: &mut Cluster,
    s: &Settings,
    names: &[String],
) -> Result<Restart> {
    let system = cl.system();
    let total = names.len();
    let led_before = leaders_per_node(cl).await?;
    let victim = (0..NODES).max_by_key(|n| led_before[*n]).unwrap_or(0);
    let alive: Vec<usize> = (0..NODES).filter(|n| *n != victim).collect();
    let wanted: HashSet<&str> = names.iter().map(String::as_str).collect();

    // RabbitMQ: the failover loop is running before the kill.
    let watch = match system {
        System::Rabbitmq => Some(failover_loop(cl, &alive).await?),
        System::Quorumq | System::QuorumqAmqp => None,
    };
    cl.kill9(victim)?;
    let label = format!(
        "12 failover of {total} queues, node {} {system}",
        victim + 1
    );
    let (failover_s, led_at_end) =
        time_failover(label, total, watch.as_ref(), &alive, &wanted).await;
    if let Some(l) = watch {
        l.stop();
    }

    // Restart: what the live replicas have applied now is what the restarted ones must reach.
    let (watch, targets) = match system {
        System::Rabbitmq => (
            Some(restart_loop(cl, s, victim, &alive).await?),
            HashMap::new(),
        ),
        System::Quorumq | System::QuorumqAmqp => (None, applied_now(&alive, &wanted).await?),
    };
    cl.start_node(victim)?;
    let started = Instant::now();
    let serves_at: Arc<Mutex<Option<f64>>> = Arc::default();
    let (caught_up_s, caught_up) = time_catch_up(
        cl,
        s,
        victim,
        (started, &serves_at),
        watch.as_ref(),
        &targets,
        total,
    )
    .await;
    if let Some(l) = watch {
        l.stop();
    }
    // The node must serve for what follows, whatever the figures say.
    let waited = cl.wait_serving(victim, s.scale_deadline).await;
    let serves_s = *serves_at.lock().unwrap();
    let serves_s = serves_s.or_else(|| waited.ok().map(|_| started.elapsed().as_secs_f64()));
    Ok(Restart {
        victim,
        led_before,
        failover_s,
        led_at_end,
        serves_s,
        caught_up_s,
        caught_up,
        members: total,
    })
}

/// RabbitMQ: a loop on a live node counting the scenario's queues led on the live nodes.
async fn failover_loop(cl: &Cluster, alive: &[usize]) -> Result<ErlLoop> {
    let step = format!(
        "begin Led = lists:foldl(fun(N, A) -> sets:union(A, LedOn(N)) end, sets:new(), {}), \
         io_lib:format(\"~b ~b\", [sets:size(Set), sets:size(Led)]) end",
        erl_nodes(alive)
    );
    let l = ErlLoop::start(
        cl,
        alive[0],
        "scale-failover",
        RABBIT_NAMES,
        &step,
        POLL,
        FAILOVER_DEADLINE + Duration::from_secs(60),
    )?;
    wait_fresh(&l).await?;
    Ok(l)
}

/// Polls until every one of `total` queues is led on a live node: through `watch` (RabbitMQ)
/// or the live nodes' `ClusterStatus`.
async fn time_failover(
    label: String,
    total: usize,
    watch: Option<&ErlLoop>,
    alive: &[usize],
    wanted: &HashSet<&str>,
) -> (Option<f64>, usize) {
    match watch {
        Some(l) => {
            wait_all(label, FAILOVER_DEADLINE, total, async || {
                l.read(STALE).and_then(|v| usize::try_from(*v.get(1)?).ok())
            })
            .await
        }
        None => {
            wait_all(label, FAILOVER_DEADLINE, total, async || {
                let mut led: HashSet<String> = HashSet::new();
                for &n in alive {
                    let st = qq_status(n).await.ok()?;
                    led.extend(
                        st.queues
                            .into_iter()
                            .filter(|q| {
                                q.leader == n as u64 + 1 && wanted.contains(q.name.as_str())
                            })
                            .map(|q| q.name),
                    );
                }
                Some(led.len())
            })
            .await
        }
    }
}

/// quorumq: per queue of `wanted`, the highest index a live replica has applied now.
async fn applied_now(alive: &[usize], wanted: &HashSet<&str>) -> Result<HashMap<String, u64>> {
    let mut targets: HashMap<String, u64> = HashMap::new();
    for &n in alive {
        for q in qq_status(n).await?.queues {
            if wanted.contains(q.name.as_str()) {
                let t = targets.entry(q.name).or_default();
                *t = (*t).max(q.local_last_applied);
            }
        }
    }
    Ok(targets)
}

/// RabbitMQ: a loop on a live node that reads what the live replicas have applied now (its
/// prelude), then counts the restarted node's replicas that have reached it.
async fn restart_loop(
    cl: &Cluster,
    s: &Settings,
    victim: usize,
    alive: &[usize],
) -> Result<ErlLoop> {
    let l = ErlLoop::start(
        cl,
        alive[0],
        "scale-restart",
        &restart_prelude(alive),
        &restart_step(victim),
        Duration::from_millis(500),
        s.scale_deadline + Duration::from_secs(60),
    )?;
    wait_fresh(&l).await?;
    Ok(l)
}

/// Erlang: `Targets`, per queue the highest index applied on the `alive` nodes.
fn restart_prelude(alive: &[usize]) -> String {
    format!(
        r#"{RABBIT_NAMES}
F = fun(_) -> ok end,
Applied = fun(Node) ->
    case rpc:call(Node, erlang, apply, [fun() ->
            [case catch ra:local_query({{Nm, node()}}, F, 2000) of
                 {{ok, {{{{I, _}}, _}}, _}} -> I;
                 _ -> -1
             end || Nm <- Names]
        end, []], 600000) of
        L when is_list(L) -> L;
        _ -> [-1 || _ <- Names]
    end
end,
Targets = maps:from_list(lists:zip(Names, lists:foldl(
    fun(Node, Acc) -> lists:zipwith(fun erlang:max/2, Applied(Node), Acc) end,
    [-1 || _ <- Names], {alive}))),
put(remaining, Names),"#,
        alive = erl_nodes(alive)
    )
}

/// Erlang: how many of the queues `victim` runs, knows a leader of and has applied up to its
/// target.
fn restart_step(victim: usize) -> String {
    format!(
        r#"begin
    Rem = get(remaining),
    Up = case rpc:call('{victim}', erlang, apply, [fun() ->
            States = maps:from_list(ets:tab2list(ra_state)),
            [{{Nm, I}} || Nm <- Rem, lists:member(maps:get(Nm, States, none), [leader, follower]),
                        {{ok, {{{{I, _}}, _}}, {{_, _}}}} <- [catch ra:local_query({{Nm, node()}}, F, 1000)]]
        end, []], 60000) of
        U when is_list(U) -> U;
        _ -> []
    end,
    Done = sets:from_list([Nm || {{Nm, I}} <- Up, I >= maps:get(Nm, Targets)]),
    Left = [Nm || Nm <- Rem, not sets:is_element(Nm, Done)],
    put(remaining, Left),
    io_lib:format("~b ~b", [length(Names), length(Names) - length(Left)])
end"#,
        victim = rabbit_node(victim)
    )
}

/// Polls the restarted `victim` until all `total` of its replicas have caught up (through
/// `watch` on RabbitMQ, else its `ClusterStatus` against `targets`); on the way, records in
/// `serves_at` when it first answered a client.
async fn time_catch_up(
    cl: &Cluster,
    s: &Settings,
    victim: usize,
    (started, serves_at): (Instant, &Arc<Mutex<Option<f64>>>),
    watch: Option<&ErlLoop>,
    targets: &HashMap<String, u64>,
    total: usize,
) -> (Option<f64>, usize) {
    let label = format!(
        "12 restart of node {} with {total} queues {}",
        victim + 1,
        cl.system()
    );
    let serves_at = serves_at.clone();
    let check_serves = async move || {
        let mut at = serves_at.lock().unwrap().is_some();
        if !at && cl.answers(victim).await {
            *serves_at.lock().unwrap() = Some(started.elapsed().as_secs_f64());
            at = true;
        }
        at
    };
    match watch {
        Some(l) => {
            wait_all(label, s.scale_deadline, total, async || {
                check_serves().await;
                l.read(STALE).and_then(|v| usize::try_from(*v.get(1)?).ok())
            })
            .await
        }
        None => {
            wait_all(label, s.scale_deadline, total, async || {
                if !check_serves().await {
                    return Some(0);
                }
                let st = qq_status(victim).await.ok()?;
                Some(
                    st.queues
                        .iter()
                        .filter(|q| {
                            targets.get(&q.name).is_some_and(|t| {
                                q.local_member && q.leader != 0 && q.local_last_applied >= *t
                            })
                        })
                        .count(),
                )
            })
            .await
        }
    }
}

/// Waits until an [`ErlLoop`] has written its first line (its prelude is done).
async fn wait_fresh(l: &ErlLoop) -> Result<()> {
    let start = Instant::now();
    while l.read(STALE).is_none() {
        if start.elapsed() > Duration::from_secs(120) {
            bail!("the RabbitMQ loop wrote nothing in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

pub(super) fn report_restart(out: &mut Outcome, n: usize, r: &Restart, s: &Settings) {
    let victim = r.victim + 1;
    match r.failover_s {
        Some(t) => out.figure(
            12,
            &format!("failover, {n} queues: all led elsewhere"),
            "s",
            Better::Lower,
            t,
        ),
        None => missing(
            out,
            format!("failover, {n} queues: all led elsewhere"),
            "s",
            Better::Lower,
        ),
    }
    out.notes.push(format!(
        "{n} queues: killed node {victim} (kill -9), which led {} (leaders per node before: {}); \
         {}",
        r.led_before[r.victim],
        r.led_before.map(|c| c.to_string()).join("/"),
        match r.failover_s {
            Some(t) => format!("every queue had a leader on a live node {t:.2} s later"),
            None => format!(
                "NOT reached in {:.0} s: {} of {n} led on a live node at the end",
                FAILOVER_DEADLINE.as_secs_f64(),
                r.led_at_end
            ),
        }
    ));
    for (what, v) in [
        ("serves again", r.serves_s),
        ("every replica caught up", r.caught_up_s),
    ] {
        let name = format!("restart, {n} queues: {what}");
        match v {
            Some(t) => out.figure(12, &name, "s", Better::Lower, t),
            None => missing(out, name, "s", Better::Lower),
        }
    }
    out.notes.push(format!(
        "{n} queues: node {victim} started again; {}; {}",
        r.serves_s
            .map_or("it did not answer a client".into(), |t| format!(
                "answered a client {t:.1} s after its start"
            )),
        match r.caught_up_s {
            Some(t) => format!("all {} of its replicas caught up at {t:.1} s", r.members),
            None => format!(
                "NOT reached in {:.0} s: {} of its {} replicas caught up",
                s.scale_deadline.as_secs_f64(),
                r.caught_up,
                r.members
            ),
        }
    ));
}
