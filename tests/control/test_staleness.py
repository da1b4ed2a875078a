"""AReaL's admission rule and the earliest-deadline-first consumption check, by hand."""

from reroll.control.staleness import allowed_lag, can_take, capacity


def test_staleness_zero_admits_one_batch_per_version():
    # (0 + 0 + 1) * 4 - (0 + 0) = 4 at the start
    assert capacity(0, max_staleness=0, batch=4, accepted=0, running=0) == 4
    # all 4 running: (0+0+1)*4 - (0+4) = 0, nothing more until the update
    assert capacity(0, max_staleness=0, batch=4, accepted=2, running=2) == 0
    # after one update: (0+1+1)*4 - (4+0) = 4
    assert capacity(1, max_staleness=0, batch=4, accepted=4, running=0) == 4


def test_staleness_two_lets_generation_run_two_versions_ahead():
    # (2 + 0 + 1) * 4 - 0 = 12 groups may start at version 0
    assert capacity(0, max_staleness=2, batch=4, accepted=0, running=0) == 12
    # version 1, 9 accepted, 2 running: (2+1+1)*4 - 11 = 5
    assert capacity(1, max_staleness=2, batch=4, accepted=9, running=2) == 5


def test_overprovision_adds_extra_groups_and_one_version_of_lag():
    # 1.5x over 4 groups: ceil(0.5*4) = 2 extra; (0+0+1)*4 + 2 = 6
    assert capacity(0, max_staleness=0, batch=4, accepted=0, running=0,
                    overprovision=1.5) == 6
    assert allowed_lag(max_staleness=0, overprovision=1.5) == 1
    assert allowed_lag(max_staleness=0) == 0 and allowed_lag(max_staleness=2) == 2
    assert allowed_lag(max_staleness=2, overprovision=2.0) == 3


def test_capacity_never_negative():
    assert capacity(0, max_staleness=0, batch=4, accepted=3, running=5) == 0


def test_a_group_due_now_may_always_be_taken():
    # trainer version 5, deadline 5: no version before its deadline to protect
    assert can_take(5, deadlines=[5, 5, 5, 5, 5], slots_left=1, trainer_version=5,
                    batch=4)


def test_a_later_group_waits_when_earlier_deadlines_need_the_slots():
    # version 1, 4 slots, batch 4. Running/ready deadlines: two due at 1, three at 2, one at 3.
    dl = [1, 1, 2, 2, 2, 3]
    # a deadline-2 group: at D=1 the slots after it, 4 - 1 + 0*4 = 3, hold the 2 due by 1
    assert can_take(2, deadlines=dl, slots_left=4, trainer_version=1, batch=4)
    # with 2 slots left: 2 - 1 = 1 < 2 due by version 1: it must wait
    assert not can_take(2, deadlines=dl, slots_left=2, trainer_version=1, batch=4)
    # a deadline-3 group with 4 slots: D=1: 3 >= 2; D=2: 3 + 4 = 7 >= 5 due by 2: yes
    assert can_take(3, deadlines=dl, slots_left=4, trainer_version=1, batch=4)
    # batch 1: D=2 leaves 3 + 1 = 4 slots for the 5 due by version 2: no
    assert not can_take(3, deadlines=dl, slots_left=4, trainer_version=1, batch=1)


def test_sizes_count_samples_not_groups():
    # batch 8 samples, version 0, 8 slots. Other groups: a 4-sample and a 2-sample group due
    # at 0 (6 samples). A 4-sample group due at 1: at D=0, 8 - 4 + 0 = 4 < 6 due: must wait
    assert not can_take(1, deadlines=[0, 0], sizes=[4, 2], slots_left=8, trainer_version=0,
                        batch=8, size=4)
    # a 2-sample group due at 1: 8 - 2 = 6 >= 6: fits
    assert can_take(1, deadlines=[0, 0], sizes=[4, 2], slots_left=8, trainer_version=0,
                    batch=8, size=2)
    # group sizes 1 reproduce the group-count rule: 4 - 1 = 3 >= 2 due by 1
    assert can_take(2, deadlines=[1, 1, 2, 2, 2, 3], slots_left=4, trainer_version=1, batch=4)
