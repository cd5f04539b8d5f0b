from tests.conftest import FINISHED


def test_ddp_two_hosts(two_hosts):
    c = two_hosts
    run = c.submit({"preset": "ddp", "runtime": {"nnodes": 2, "nproc_per_node": 2},
                    "parallel": {"dp": 4}, "train": {"steps": 2}})
    done = c.wait_status(run["id"], FINISHED, 180)
    print(done["status"], done["error"])
    print(done["summary"].get("nodes") if done["summary"] else None)
    assert done["status"] == "succeeded", (done["error"], c.logs())
