"""A small library that lives only in the demo bucket: the target imports it lazily."""

import hashlib


def hello(name: str) -> str:
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"hello, {name} (sha256 {digest}) from a library fetched at import time"
