"""Shared test helpers: real servers on loopback, real certificates, real databases."""
