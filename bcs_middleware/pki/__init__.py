"""Certificates: the gateway's CA and server certificate, their files, renewal and the bundles the CLI writes."""
