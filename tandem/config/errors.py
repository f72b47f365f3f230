"""The config's one error type and the one-line check every validation is written with."""


class ConfigError(ValueError):
    """A bad config value or key; the message names the dotted key. `problems`: each one of them,
    when one check found several (its message then lists them)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or [message]


def raise_all(problems: list[str]) -> None:
    """Raise one ConfigError holding every problem (one per line), if there is any."""
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} config problems:\n" + "\n".join(f"- {p}" for p in problems), problems)


def check(ok: bool, key: str, msg: str) -> None:
    """Raise ConfigError("<key>: <msg>") unless `ok` (`key` is the dotted key at fault)."""
    if not ok:
        raise ConfigError(f"{key}: {msg}")
