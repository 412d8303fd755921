//! [`MetaState::route`]: which queues a publish reaches, through exchange-to-exchange bindings
//! and alternate exchanges, as RabbitMQ's `rabbit_exchange:route`.

use super::*;

impl MetaState {
    /// Routes a publish to exchange `exchange` with `routing_keys` (the key plus CC and BCC
    /// keys, see [`route::routing_keys`]) and `headers`. The default exchange (`""` or
    /// `amq.default`) routes to the existing queues named by the keys. Returns the distinct
    /// target queues, sorted by name; NOT_FOUND if the vhost or exchange is missing.
    ///
    /// From the first exchange the walk follows every matching binding: a queue is a target,
    /// an exchange routes the message on with the same keys and headers. An exchange none of
    /// whose bindings match hands the message to its alternate exchange. Each exchange is
    /// visited once, so a cycle of bindings or alternate exchanges ends; a missing alternate
    /// exchange ends its branch.
    pub fn route(
        &self,
        vhost: &str,
        exchange: &str,
        routing_keys: &[String],
        headers: &Table,
    ) -> Result<Vec<&QueueMeta>, MetaError> {
        let v = self
            .vhosts
            .get(vhost)
            .ok_or_else(|| vhost_not_found(vhost))?;
        if is_default_exchange(exchange) {
            let names: BTreeSet<&str> = routing_keys.iter().map(String::as_str).collect();
            return Ok(names.into_iter().filter_map(|n| v.queues.get(n)).collect());
        }
        let first = v
            .exchanges
            .get(exchange)
            .ok_or_else(|| exchange_not_found(vhost, exchange))?;
        // Borrowed, not cloned: this runs for every publish.
        let mut targets: BTreeSet<&str> = BTreeSet::new();
        let mut seen: BTreeSet<&str> = BTreeSet::from([first.name.as_str()]);
        let mut work = vec![first];
        while let Some(x) = work.pop() {
            let matches = |b: &&Binding| {
                x.kind
                    .binding_matches(&b.routing_key, &b.arguments, routing_keys, headers)
            };
            let mut matched = false;
            for b in v.bindings_from(&x.name).filter(matches) {
                matched = true;
                targets.insert(&b.destination);
            }
            let mut next: Vec<&str> = Vec::new();
            for b in v.exchange_bindings_from(&x.name).filter(matches) {
                matched = true;
                next.push(&b.destination);
            }
            if !matched {
                next.extend(v.alternate_exchange(x));
            }
            for name in next {
                if let Some(dest) = v.exchanges.get(name)
                    && seen.insert(dest.name.as_str())
                {
                    work.push(dest);
                }
            }
        }
        Ok(targets
            .into_iter()
            .filter_map(|n| v.queues.get(n))
            .collect())
    }
}
