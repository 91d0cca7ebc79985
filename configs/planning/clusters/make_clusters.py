#!/usr/bin/env python3
"""Writes the example cluster files next to this script from configs/devices.json.

A cluster file normally comes from `hetrain probe --json`; these describe clusters that
were never probed, so every rank's figures are the catalogue's datasheet figures, with
sgemm_gflops set to fp32 peak x the catalogue's efficiency for the device's kind (the
rate a `synth:` cluster is planned at). Written from the catalogue so the two cannot
drift apart: run it again after changing configs/devices.json.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CATALOGUE = os.path.join(HERE, "..", "..", "devices.json")
GIB = 1 << 30
NOT_RUNNABLE = ("PLANNING EXAMPLE, not a probed cluster and not runnable on this machine: "
                "figures are the datasheet figures of configs/devices.json. ")


def load_catalogue():
    with open(CATALOGUE) as f:
        cat = json.load(f)
    return {d["id"]: d for d in cat["devices"]}, cat["efficiency"], cat["link_classes"]


def cluster(description, hosts, link_of, catalogue):
    """hosts: [(host name, site, [device id per rank][, host memory in GiB])]; link_of(a, b)
    -> link class for two ranks given as (host, site) pairs. A host's memory is its CPU
    rank's catalogue memory, else the GiB given, else 64 GiB (a desktop's)."""
    devices, efficiency, links = catalogue
    ranks, where = [], []
    for host, site, ids, *given in hosts:
        gpus = [devices[i] for i in ids if devices[i]["kind"] == "cuda"]
        cpu = next((devices[i] for i in ids if devices[i]["kind"] == "cpu"), None)
        host_memory = cpu["memory_gb"] * GIB if cpu else (given[0] if given else 64) * GIB
        gpu_list = [{"index": k, "name": g["name"], "compute_capability": "0.0", "sm_count": 1,
                     "memory_total_bytes": int(g["memory_gb"] * GIB),
                     "memory_free_bytes": int(g["memory_gb"] * GIB),
                     "host_to_device_gb_s": g["host_link"]["gb_s"],
                     "device_to_host_gb_s": g["host_link"]["gb_s"]} for k, g in enumerate(gpus)]
        local = 0
        for i in ids:
            d = devices[i]
            ranks.append({
                "rank": len(ranks), "local_rank": local,
                "host": {"host": host, "cpu_model": cpu["name"] if cpu else "host CPU (not a rank)",
                         "physical_cores": 8, "hardware_threads": 16,
                         "memory_total_bytes": int(host_memory), "memory_available_bytes": int(host_memory),
                         "gpus": gpu_list, "gpu_note": "from configs/devices.json (" + ", ".join(ids) + ")"},
                "device": {"kind": d["kind"], "threads": 1,
                           "sgemm_gflops": round(d["fp32_tflops"] * 1000 * efficiency[d["kind"]], 3),
                           "sgemm_size": 1024, "memory_bandwidth_gb_s": d["memory_bandwidth_gb_s"]},
                "memory_cap_bytes": 0, "blocks": [], "emulation": []})
            where.append((host, site))
            # A CPU rank is not a GPU index; GPU ranks take the host's GPUs in order.
            if d["kind"] == "cuda":
                local += 1
    n = len(ranks)
    lat = [[0.0] * n for _ in range(n)]
    bw = [[0.0] * n for _ in range(n)]
    for a in range(n):
        for b in range(n):
            if a != b:
                lc = links[link_of(where[a], where[b])]
                lat[a][b] = lc["latency_us"] * 1e-6
                bw[a][b] = lc["bandwidth_gb_s"] * 1e9
    return {"format": "hetrain-cluster/1", "description": NOT_RUNNABLE + description,
            "world_size": n, "model": "", "ranks": ranks,
            "links": {"emulated": False, "latency_s": lat, "bandwidth_bytes_per_s": bw}}


def home_lab(cat):
    # Four machines on one 1 GbE switch: a desktop with the two 3060s, one box each for
    # the 3090 and the 4090, and a laptop whose CPU is a rank.
    hosts = [("desktop", "home", ["rtx3060", "rtx3060"]), ("box-3090", "home", ["rtx3090"]),
             ("box-4090", "home", ["rtx4090"]), ("laptop", "home", ["cpu-laptop-8c"])]
    return cluster("Home lab: 2x RTX 3060 (one desktop, PCIe between them), RTX 3090, RTX 4090 and an "
                   "8-core laptop CPU, 4 machines over 1 GbE.", hosts,
                   lambda a, b: "pcie" if a[0] == b[0] else "ethernet-1g", cat)


def university_lab(cat):
    # Servers, not desktops: 512 GiB of host memory each (a DGX-1's 512 GB).
    hosts = [("dgx-v100", "lab", ["v100-32g"] * 4, 512), ("hgx-a100", "lab", ["a100-40g"] * 4, 512)]
    return cluster("University lab: two hosts of 512 GiB, 4x V100 SXM2 32GB and 4x A100 SXM4 40GB, NVLink "
                   "within a host and 10 GbE between them.", hosts,
                   lambda a, b: "nvlink" if a[0] == b[0] else "ethernet-10g", cat)


def volunteer_pool(cat):
    # 16 volunteers' machines of 4 like GPUs each, in 4 sites; 1 GbE within a site, the
    # internet (wan) between sites. 24x 3060, 16x 3090, 8x 4090, 8x 4070, 8x 2080 Ti.
    sites = {
        "site-a": ["rtx3060", "rtx3060", "rtx3090", "rtx4090"],
        "site-b": ["rtx3060", "rtx3090", "rtx4070", "rtx2080ti"],
        "site-c": ["rtx3060", "rtx3060", "rtx3090", "rtx4070"],
        "site-d": ["rtx3060", "rtx3090", "rtx4090", "rtx2080ti"],
    }
    hosts = []
    for site, kinds in sites.items():
        for k, dev in enumerate(kinds):
            hosts.append((f"{site}-pc{k}", site, [dev] * 4))
    return cluster("Volunteer pool: 64 consumer GPUs (24x RTX 3060, 16x RTX 3090, 8x RTX 4090, "
                   "8x RTX 4070, 8x RTX 2080 Ti) on 16 machines of 4 in 4 sites; PCIe within a machine, "
                   "1 GbE within a site, wide-area links (30 ms, 50 MB/s) between sites.", hosts,
                   lambda a, b: "pcie" if a[0] == b[0] else "ethernet-1g" if a[1] == b[1] else "wan", cat)


def dumps(c):
    """The file as JSON with one matrix row per line (a 64-rank matrix is 4,096 numbers)."""
    links = c.pop("links")
    text = json.dumps(c, indent=1)[:-2]
    rows = lambda m: ",\n".join("   " + json.dumps(r) for r in m)
    return (text + ',\n "links": {\n  "emulated": false,\n  "latency_s": [\n' + rows(links["latency_s"]) +
            '\n  ],\n  "bandwidth_bytes_per_s": [\n' + rows(links["bandwidth_bytes_per_s"]) + "\n  ]\n }\n}\n")


def main():
    cat = load_catalogue()
    for name, make in (("home_lab", home_lab), ("university_lab", university_lab),
                       ("volunteer_pool", volunteer_pool)):
        path = os.path.join(HERE, name + ".json")
        with open(path, "w") as f:
            f.write(dumps(make(cat)))
        print("wrote", os.path.relpath(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
