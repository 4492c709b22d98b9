"""The generator as a hypothesis strategy, for fuzzing a design from one's own tests:

    @given(case=fuzz_cases())
    def test_my_design_keeps_the_red_zone(case):
        assert not check_case(case, "my-design").finding

Needs hypothesis (a test dependency): import this module only from tests.
"""

from __future__ import annotations

from hypothesis import strategies as st

from emu.abi import RED_ZONE
from emu.fuzz.case import (
    ARITH_FLAGS,
    CASE_REGS,
    CONDITIONS,
    FLAGS_BASE,
    MAX_STORES,
    Action,
    ActionKind,
    Case,
    Store,
    StoreKind,
)
from emu.fuzz.generator import MOVE_SP_STEPS
from emu.fuzz.sites import ENTRIES, SITES

ANY_U64 = st.integers(0, (1 << 64) - 1)


def _mov_store(size: int) -> st.SearchStrategy[Store]:
    return st.builds(Store, st.integers(size, RED_ZONE), st.just(size), st.just(StoreKind.MOV),
                     st.integers(0, (1 << (8 * size)) - 1))


def stores() -> st.SearchStrategy[Store]:
    """One red-zone store of any kind the generator makes."""
    wide = st.integers(0, (1 << 128) - 1)
    return st.one_of(
        *(_mov_store(size) for size in (1, 2, 4, 8)),
        st.builds(Store, st.integers(16, RED_ZONE), st.just(16), st.just(StoreKind.MOVDQU), wide),
        st.builds(Store, st.sampled_from(range(24, RED_ZONE + 1, 16)), st.just(16), st.just(StoreKind.MOVAPS), wide),
        st.builds(Store, st.integers(1, RED_ZONE), st.just(1), st.just(StoreKind.SETCC), st.just(0),
                  st.sampled_from(CONDITIONS)),
    )


def actions() -> st.SearchStrategy[Action | None]:
    return st.one_of(
        st.none(),
        st.builds(Action, st.just(ActionKind.SET_REG), st.sampled_from(CASE_REGS), ANY_U64),
        st.just(Action(ActionKind.REDIRECT)),
        st.builds(Action, st.just(ActionKind.MOVE_SP), st.just(""), st.sampled_from(MOVE_SP_STEPS)),
    )


def _flags(bits: list[int]) -> int:
    return FLAGS_BASE | sum(set(bits))


def fuzz_cases(sites: tuple[str, ...] = tuple(SITES), max_stores: int = MAX_STORES) -> st.SearchStrategy[Case]:
    """Cases as the campaign generates them; ``sites`` narrows the probe-site forms."""
    return st.tuples(st.sampled_from(sites), actions()).filter(_compatible).flatmap(
        lambda pair: _cases(pair[0], pair[1], max_stores))


def _compatible(pair: tuple[str, Action | None]) -> bool:
    site, action = pair
    return not (action is not None and action.kind is ActionKind.MOVE_SP and SITES[site].pushes)


def _cases(site: str, action: Action | None, max_stores: int) -> st.SearchStrategy[Case]:
    return st.builds(
        Case,
        seed=st.just(0), index=st.just(0), site=st.just(site), entry=st.sampled_from(tuple(ENTRIES)),
        stores=st.lists(stores(), max_size=max_stores).map(tuple),
        regs=st.tuples(*(ANY_U64 for _ in CASE_REGS)), flags=st.lists(st.sampled_from(ARITH_FLAGS)).map(_flags),
        action=st.just(action), uretprobe=st.booleans(),
    )
