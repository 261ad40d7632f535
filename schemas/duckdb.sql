-- DuckDB DDL of the checkpointed projections: the tables State declares
-- (reducers/state.py), as projections/store.py makes them
CREATE TABLE IF NOT EXISTS proxies (
    ip VARCHAR NOT NULL, port INTEGER NOT NULL, proto VARCHAR, last_seen BIGINT, row BLOB NOT NULL, PRIMARY KEY (ip, port));
CREATE TABLE IF NOT EXISTS sources (
    url_id VARCHAR PRIMARY KEY, url VARCHAR, check_time BIGINT, row BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    target VARCHAR PRIMARY KEY, kind VARCHAR, status VARCHAR, row BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS agents (
    name VARCHAR PRIMARY KEY, row BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS deposits (
    key VARCHAR PRIMARY KEY, status VARCHAR, row BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS sites (
    site VARCHAR NOT NULL, chunk BIGINT NOT NULL, row BLOB NOT NULL, PRIMARY KEY (site, chunk));
CREATE TABLE IF NOT EXISTS site_proxies (
    ip VARCHAR NOT NULL, port INTEGER NOT NULL, row BLOB NOT NULL, PRIMARY KEY (ip, port));
CREATE TABLE IF NOT EXISTS quality (
    ip VARCHAR NOT NULL, port INTEGER NOT NULL, row BLOB NOT NULL, PRIMARY KEY (ip, port));
CREATE TABLE IF NOT EXISTS meta (k VARCHAR PRIMARY KEY, v VARCHAR NOT NULL);
