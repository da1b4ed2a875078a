"""AReaL's admission rule, checked by hand."""

from reroll.control.staleness import allowed_lag, capacity, is_stale


def test_staleness_zero_admits_one_batch_per_version():
    # (0 + 0 + 1) * 4 - (0 + 0) = 4 at the start
    assert capacity(0, max_staleness=0, batch_groups=4, accepted=0, running=0) == 4
    # all 4 running: (0+0+1)*4 - (0+4) = 0, nothing more until the update
    assert capacity(0, max_staleness=0, batch_groups=4, accepted=2, running=2) == 0
    # after one update: (0+1+1)*4 - (4+0) = 4
    assert capacity(1, max_staleness=0, batch_groups=4, accepted=4, running=0) == 4


def test_staleness_two_lets_generation_run_two_versions_ahead():
    # (2 + 0 + 1) * 4 - 0 = 12 groups may start at version 0
    assert capacity(0, max_staleness=2, batch_groups=4, accepted=0, running=0) == 12
    # version 1, 9 accepted, 2 running: (2+1+1)*4 - 11 = 5
    assert capacity(1, max_staleness=2, batch_groups=4, accepted=9, running=2) == 5


def test_overprovision_adds_extra_groups_and_one_version_of_lag():
    # 1.5x over 4 groups: ceil(0.5*4) = 2 extra; (0+0+1)*4 + 2 = 6
    assert capacity(0, max_staleness=0, batch_groups=4, accepted=0, running=0,
                    overprovision=1.5) == 6
    assert allowed_lag(max_staleness=0, overprovision=1.5) == 1
    assert not is_stale(3, 2, max_staleness=0, overprovision=1.5)
    assert is_stale(3, 2, max_staleness=0)
    assert is_stale(5, 2, max_staleness=2) and not is_stale(4, 2, max_staleness=2)


def test_capacity_never_negative():
    assert capacity(0, max_staleness=0, batch_groups=4, accepted=3, running=5) == 0
