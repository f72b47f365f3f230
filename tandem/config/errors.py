"""The config's one error type and the one-line check every validation is written with."""


class ConfigError(ValueError):
    """A bad config value or key; the message names the dotted key."""


def check(ok: bool, key: str, msg: str) -> None:
    """Raise ConfigError("<key>: <msg>") unless `ok` (`key` is the dotted key at fault)."""
    if not ok:
        raise ConfigError(f"{key}: {msg}")
