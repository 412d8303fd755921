//! Exchange-to-exchange bindings (metadata machine version 2): `BindExchange` and
//! `UnbindExchange`, as RabbitMQ's `exchange.bind`. A binding's source routes what matches it
//! on to its destination exchange ([`MetaState::route`] walks them, each exchange once).

use super::*;

impl MetaState {
    /// Adds (`add`) or removes the binding of exchange `destination` to exchange `source`.
    /// Both must exist (NOT_FOUND naming the missing one); the default exchange can be neither
    /// (PERMISSION_DENIED, as RabbitMQ's ACCESS_REFUSED). Removing a binding that does not
    /// exist succeeds, as RabbitMQ's `exchange.unbind`; an auto-delete source left without
    /// bindings is deleted.
    pub(super) fn bind_exchange(
        &mut self,
        vhost: &str,
        binding: Binding,
        add: bool,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        if is_default_exchange(&binding.source) || is_default_exchange(&binding.destination) {
            return Err(default_exchange_refused());
        }
        let kind = v
            .exchanges
            .get(&binding.source)
            .ok_or_else(|| exchange_not_found(vhost, &binding.source))?
            .kind;
        if !v.exchanges.contains_key(&binding.destination) {
            return Err(exchange_not_found(vhost, &binding.destination));
        }
        if add {
            route::validate_binding_arguments(kind, &binding.arguments)?;
            v.exchange_bindings.insert(binding);
        } else {
            v.remove_bindings(|_| false, |b| *b == binding);
        }
        Ok(MetaReply::Ok)
    }
}
