"""Reads a callgrind dump, for cost_top.py and grpc_top.py."""

import collections
import re


def load(path): # self and inclusive costs per function name from a callgrind dump
    names, selfc, inclc = {}, collections.Counter(), collections.Counter()
    fn = cfn = None; pending_call = False
    def resolve(s):
        m = re.match(r"\((\d+)\)(?:\s+(.*))?$", s)
        if not m: return s
        if m.group(2) is not None: names[m.group(1)] = m.group(2)
        return names.get(m.group(1), s)
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("fn="): fn = resolve(line[3:]); pending_call = False
        elif line.startswith("cfn="): cfn = resolve(line[4:])
        elif line.startswith("calls="): pending_call = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            parts = line.split()
            if len(parts) < 2: continue
            if pending_call:
                pending_call = False
                if cfn != fn: inclc[fn] += int(parts[1])
            else:
                selfc[fn] += int(parts[1])
    return selfc, inclc
