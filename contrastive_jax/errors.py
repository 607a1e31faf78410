"""A user's mistake: the error whose one-line message names the setting and a fix, and the
two rules every module checks with the same wording ("a positive multiple of", "a
divisor of").

The command line prints a `ConfigError` as one line (`error: ...`) and exits with
status 2; any other exception is a bug and keeps its traceback. Importing this module
imports nothing else.
"""


class ConfigError(ValueError):
    """A config, flag or workdir that cannot train; the one-line message names the field
    and a fix."""


def check_multiple(value: int, factor: int, name: str, factor_is: str) -> None:
    """The one rule "a positive multiple of": raises a ConfigError unless `value` (the
    setting `name`) is a positive multiple of `factor` (which `factor_is` names),
    naming the nearest multiples."""
    if value > 0 and value % factor == 0:
        return
    lower = value - value % factor
    nearest = " or ".join(str(m) for m in (lower, lower + factor) if m > 0)
    raise ConfigError(f"{name}={value} must be a multiple of {factor_is} ({factor}); use {nearest}.")


def check_divides(value: int, whole: int, name: str, whole_is: str) -> None:
    """The one rule "a divisor of": raises a ConfigError unless `value` (the setting
    `name`) is a positive divisor of `whole` (which `whole_is` names), naming the
    nearest divisors."""
    if value > 0 and whole % value == 0:
        return
    divisors = [d for d in range(1, whole + 1) if whole % d == 0]
    below = [d for d in divisors if d < value][-1:]
    above = [d for d in divisors if d > value][:1]
    nearest = " or ".join(str(d) for d in below + above)
    raise ConfigError(f"{name}={value} must divide {whole_is} ({whole}); use {nearest}.")
