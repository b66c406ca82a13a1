//! The channel merchants onceflow acts as: each tenant's channel merchant id (`--channel-merchants`, by default
//! the tenant's name) and each merchant's notification secrets (`--channel-notify-secrets`).

use std::collections::HashMap;

/// Each tenant's channel merchant id and each merchant's notification secrets. Its `Debug` shows no secret.
#[derive(Clone, Default)]
pub struct ChannelAccounts {
    /// tenant → merchant id, where it is not the tenant's name.
    merchants: HashMap<String, String>,
    /// merchant id → its secrets (several while one is rotated).
    secrets: HashMap<String, Vec<String>>,
}

impl std::fmt::Debug for ChannelAccounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut merchants: Vec<_> = self.secrets.keys().collect();
        merchants.sort();
        f.debug_struct("ChannelAccounts").field("merchants", &self.merchants).field("with_secrets", &merchants).finish()
    }
}

impl ChannelAccounts {
    /// From `(tenant, merchant_id)` and `(merchant_id, secret)` pairs; a merchant named twice has both secrets.
    pub fn new(merchants: Vec<(String, String)>, secrets: Vec<(String, String)>) -> Self {
        let mut by_merchant: HashMap<String, Vec<String>> = HashMap::new();
        for (merchant, secret) in secrets {
            by_merchant.entry(merchant).or_default().push(secret);
        }
        Self { merchants: merchants.into_iter().collect(), secrets: by_merchant }
    }

    /// The tenant's channel merchant id.
    pub fn merchant_of<'a>(&'a self, tenant: &'a str) -> &'a str {
        self.merchants.get(tenant).map_or(tenant, String::as_str)
    }

    /// The tenant whose merchant id `merchant_id` is: the one mapped to it, else the tenant of that name unless
    /// that tenant is mapped to another merchant id.
    pub fn tenant_of<'a>(&'a self, merchant_id: &'a str) -> Option<&'a str> {
        if let Some((tenant, _)) = self.merchants.iter().find(|(_, m)| *m == merchant_id) {
            return Some(tenant);
        }
        (!self.merchants.contains_key(merchant_id)).then_some(merchant_id)
    }

    /// The secrets the merchant's notifications may be signed with (none: its notifications are refused).
    pub fn secrets_of(&self, merchant_id: &str) -> Vec<&str> {
        self.secrets.get(merchant_id).map(|s| s.iter().map(String::as_str).collect()).unwrap_or_default()
    }

    /// Whether any merchant has a secret (notifications can be taken at all).
    pub fn takes_notifications(&self) -> bool {
        !self.secrets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_and_merchants_map_both_ways() {
        let pairs = |p: &[(&str, &str)]| p.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect();
        let a =
            ChannelAccounts::new(pairs(&[("acme", "M-1")]), pairs(&[("M-1", "s1"), ("M-1", "s2"), ("globex", "g")]));
        assert_eq!(a.merchant_of("acme"), "M-1");
        assert_eq!(a.merchant_of("globex"), "globex");
        assert_eq!(a.tenant_of("M-1"), Some("acme"));
        assert_eq!(a.tenant_of("globex"), Some("globex"));
        assert_eq!(a.tenant_of("acme"), None, "acme's merchant is M-1: merchant `acme` is nobody's");
        assert_eq!(a.secrets_of("M-1"), ["s1", "s2"]);
        assert!(a.secrets_of("acme").is_empty());
        assert!(!format!("{a:?}").contains("s1"));
    }
}
