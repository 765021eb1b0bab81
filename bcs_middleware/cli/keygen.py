"""``bcs-middleware keygen``: a new key for encrypting credentials at rest."""

from __future__ import annotations

import argparse


def cmd_keygen(args: argparse.Namespace) -> int:
    from cryptography.fernet import Fernet

    print(Fernet.generate_key().decode())
    return 0
