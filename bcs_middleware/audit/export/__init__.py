"""Audit events exported without loss: a webhook as kube-apiserver's, RFC 5424 syslog, a durable spool."""
