#!/usr/bin/env python3
"""Markdown tables from `ddmlip bench model --json` output files.

Each file holds one or more JSON objects back to back (one per `bench model`
invocation, as the run scripts append them). Speed-up and efficiency are
computed across invocations against the record with 1 rank and 1 thread
(the serial baseline), or else the record with the fewest pool threads:

  speed-up   = t_base / t
  efficiency = speed-up * pool_threads_base / pool_threads

Usage: python3 summarize.py FILE [FILE...]
"""
import json
import sys


def records(path):
    text = open(path).read()
    dec = json.JSONDecoder()
    i, out = 0, []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        obj, i = dec.raw_decode(text, i)
        out.extend(obj.get('records', []))


def table(recs):
    base = min(recs, key=lambda r: (r['pool_threads'], r['ranks']))
    head = recs[0]
    print(f"\n{head['model']} {head['dtype']}, {head['structure']}: {head['atoms']:,} atoms, "
          f"{head['edges'] / head['atoms']:.1f} edges/atom\n")
    print('| ranks × threads | median s | CPU s | µs/atom/step | atom·steps/s | peak RSS GiB '
          '| KiB/atom | ghost/owned | MiB sent/step | speed-up | efficiency |')
    print('|---|---|---|---|---|---|---|---|---|---|---|')
    for r in sorted(recs, key=lambda r: (r['ranks'], r['threads_per_rank'])):
        s = base['median_s'] / r['median_s']
        e = s * base['pool_threads'] / r['pool_threads']
        print(f"| {r['ranks']} × {r['threads_per_rank']} | {r['median_s']:.3f} | "
              f"{r['median_cpu_s']:.2f} | {r['us_per_atom_step']:.1f} | "
              f"{r['atom_steps_per_s']:,.0f} | {r['peak_rss_bytes'] / 2**30:.2f} | "
              f"{r['peak_rss_per_atom'] / 1024:.1f} | {r['ghost_owned_ratio']:.2f} | "
              f"{r['bytes_per_step'] / 2**20:.1f} | {s:.2f} | {100 * e:.0f} % |")


def main():
    for path in sys.argv[1:]:
        groups = {}
        for r in records(path):
            key = (r['model'], r['dtype'], r['atoms'], r.get('matmul_num_threads'))
            groups.setdefault(key, []).append(r)
        for key, recs in groups.items():
            if key[3] not in (None, '1'):
                print(f"\n(MATMUL_NUM_THREADS={key[3]!r})")
            table(recs)


if __name__ == '__main__':
    main()
