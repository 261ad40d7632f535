// ppf: APL queries behind the Axiom dashboard (dashboard.json uses the same text).
// Dataset: the one the tap writes to (AXIOM_DATASET, default "ppf"). Every folded event
// is a row with _time = its JetStream server time, type, subject, seq and its fields;
// every 10 s the fold adds a row of type "metrics".

// -- lease rate (grants and lost claims are both Leased rows; the ledger decides) --
['ppf'] | where type == "Leased" | summarize leases = count() by bin_auto(_time)

// -- fetch rate and fetch error rate --
['ppf'] | where type == "Fetched" | summarize fetches = count(), errors = countif(ok == false) by bin_auto(_time)

// -- error rate as a share of fetches --
['ppf'] | where type == "Fetched" | summarize error_share = 100.0 * countif(ok == false) / count() by bin_auto(_time)

// -- fold rate and fold lag (from the fold's metrics rows) --
['ppf'] | where type == "metrics" | summarize fold_rate = avg(['rate_1m.fold']), lag = max(lag), lag_s = max(lag_s) by bin_auto(_time)

// -- confirmations and failed rechecks --
['ppf'] | where type in ("ProxyWorked", "ProxyFailed") | summarize count() by type, bin_auto(_time)

// -- pool size by protocol: distinct proxies confirmed in the last TTL (4 h) --
['ppf'] | where type == "ProxyWorked" and _time > ago(4h) | summarize proxies = dcount(strcat(ip, ":", tostring(port))) by proto

// -- pool by anonymity --
['ppf'] | where type == "ProxyWorked" and _time > ago(4h) | summarize proxies = dcount(strcat(ip, ":", tostring(port))) by anonymity

// -- per-agent activity --
['ppf'] | where type != "metrics" | summarize events = count(), last_seen = max(_time) by agent, type | order by last_seen desc

// -- queue depth: due sources and stale proxies (from /v1/stats, shipped in metrics rows) --
['ppf'] | where type == "metrics" | summarize sources = max(sources), known = max(proxies_known) by bin_auto(_time)

// -- NATS operations by kind --
['ppf'] | where type == "metrics" | summarize publishes = max(['nats.publish']), direct_gets = max(['nats.direct_get']), stream_info = max(['nats.stream_info']) by bin_auto(_time)

// -- deposit store operations by outcome (puts, gets, deletes; lists must stay at zero) --
['ppf'] | where type == "metrics" | summarize puts = max(['deposit.put.ok']), gets = max(['deposit.get.ok']), missing = max(['deposit.get.missing']), digest = max(['deposit.get.digest']), deletes = max(['deposit.delete.ok']), lists = max(['deposit.list.ok']) by bin_auto(_time)

// -- seed plans: deposits announced, folded and rejected --
['ppf'] | where type in ("Deposited", "DepositFolded", "DepositRejected") | summarize count() by type, bin_auto(_time)

// -- tap health: rows the tap could not deliver --
['ppf'] | where type == "metrics" | summarize dropped = max(['tap.dropped']) by bin_auto(_time)

// -- top sources by yield (Extracted counts per source) --
['ppf'] | where type == "Extracted" and _time > ago(24h) | summarize candidates = avg(count) by url_id | top 20 by candidates
