"""Asserting that an RPC fails with a given status and message."""
import grpc

from tandem.rpc.errors import TandemError


async def expect_error(coro, code: grpc.StatusCode, *fragments: str) -> str:
    """Await `coro`; it must fail with status `code` and a message containing every fragment."""
    try:
        await coro
    except TandemError as e:
        msg = str(e)
        assert e.code == code, f"expected {code.name}, got {e.code.name}: {msg}"
        for frag in fragments:
            assert frag in msg, f"{frag!r} not in {msg!r}"
        return msg
    raise AssertionError(f"call succeeded; expected {code.name} mentioning {fragments}")
