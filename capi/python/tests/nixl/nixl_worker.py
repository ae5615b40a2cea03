"""One NIXL agent with the TUTTI backend in its own process, for the multi-process tests.

  python nixl_worker.py NAME PARAMS_JSON STEPS_JSON

Steps, in order: {"write": [keys]} stores them (one transfer, shuffled slots), {"read": [keys]}
loads them into other slots and checks every byte, {"flag": path} creates a file,
{"wait": path} waits (30 s at most) until it exists, {"post_write": [keys]} posts a WRITE and
never polls it (the store is never committed), then {"hang": true} sleeps until killed.
Prints one JSON line per step: {"step": ..., "state": "DONE"|"ERR"|..., "bad": [keys]}.
"""

import json
import random
import sys
import time
from pathlib import Path

import nixl_tutti as nt


def main() -> int:
    name, params, steps = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    a = nt.tutti_agent(name, **params)
    region = nt.Region(a, 64)
    dev = 0
    for step in steps:
        kind, arg = next(iter(step.items()))
        out = {"step": kind}
        if kind in ("write", "read", "post_write"):
            _, devs = nt.register_objects(a, arg, first_dev=dev)
            dev += len(arg)
            slots = random.Random(name).sample(range(region.blocks), len(arg))
            if kind == "write":
                out["state"] = nt.write_keys(a, region, arg, slots, devs)
            elif kind == "read":
                for s in slots:
                    region.block(s)[:] = 0xEE
                out["state"] = nt.read_keys(a, region, slots, devs)
                out["bad"] = [k for k, s in zip(arg, slots) if not (region.block(s) == nt.content(k)).all()]
            else:
                for k, s in zip(arg, slots):
                    region.block(s)[:] = nt.content(k)
                local = region.descs(slots)
                remote = a.get_xfer_descs([(0, nt.BLOCK, d) for d in devs], "OBJ")
                h = a.initialize_xfer("WRITE", local, remote, a.name)
                out["state"] = a.transfer(h)
        elif kind == "flag":
            Path(arg).touch()
        elif kind == "wait":
            end = time.monotonic() + 30
            while not Path(arg).exists():
                if time.monotonic() > end:
                    out["state"] = "TIMEOUT"
                    break
                time.sleep(0.01)
        elif kind == "hang":
            print(json.dumps(out), flush=True)
            time.sleep(600)
        print(json.dumps(out), flush=True)
    region.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
