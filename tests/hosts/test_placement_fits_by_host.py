"""'Can this run ever be placed' counts HOSTS, like `pick` (issue 43, miss 2): two workers on
one host are one machine, so a 2-node run never fits there however many workers it runs.
Expected by hand from the capacity rows; no database, no processes."""

from __future__ import annotations

from backend.services import placement


def _cap(worker, host, slots=2, ranks=2):
    return placement.Capacity(worker, host, slots, ranks)


def test_two_workers_on_one_host_never_fit_a_two_node_run():
    caps = [_cap("w1", "hostA"), _cap("w2", "hostA")]
    assert placement.fits_when_free(caps, 1, 2)
    assert not placement.fits_when_free(caps, 2, 2)
    assert not placement.fits_when_free(caps, 2, 1)
    caps.append(_cap("w3", "hostB"))
    assert placement.fits_when_free(caps, 2, 2)
    assert not placement.fits_when_free(caps, 3, 2)


def test_a_host_counts_only_through_a_worker_big_enough():
    # hostB's only worker has 1 rank: it cannot hold a 2-rank node, even when free
    caps = [_cap("w1", "hostA"), _cap("w2", "hostB", ranks=1), _cap("w3", "hostC", slots=0)]
    assert not placement.fits_when_free(caps, 2, 2)
    assert placement.fits_when_free(caps, 2, 1)  # hostA and hostB
    assert not placement.fits_when_free(caps, 3, 1)  # hostC has no slot at all
