#!/usr/bin/env python
"""Medians of 20 CUDA-event timings of the GEMM shapes of a products-like GCN step (N = 2,449,029):
layer 1 with the kept input aggregation at K = 100 and zero-padded to 104 and 128, and layer 2.
Prints JSON (benchmarks/results/h100/gemm_probe.json holds one run).

    python benchmarks/gemm_probe.py
"""
import torch, statistics, json, os
def ms(fn, reps=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ev=[]
    for _ in range(reps):
        s,e=torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); ev.append((s,e))
    torch.cuda.synchronize()
    return round(statistics.median(s.elapsed_time(e) for s,e in ev),3)
N=2449029; dev='cuda'
res={}
G=torch.randn(N,64,device=dev)
b=torch.randn(64,device=dev)
for K in (100,104,128):
    kept=torch.randn(N,K,device=dev); W=torch.randn(64,K,device=dev)
    res[f'K{K} mm+add']=ms(lambda: torch.mm(kept,W.t())+b)
    res[f'K{K} mm']=ms(lambda: torch.mm(kept,W.t()))
    res[f'K{K} addmm']=ms(lambda: torch.addmm(b,kept,W.t()))
    res[f'K{K} gradW G.t()@kept']=ms(lambda: G.t().mm(kept))
    res[f'K{K} gradW kept.t()@G']=ms(lambda: kept.t().mm(G))
    res[f'K{K} F.linear fwd+bwd']=ms(lambda: torch.autograd.grad(torch.nn.functional.linear(kept, W.requires_grad_()), W, G)); W.requires_grad_(False)
    del kept, W
h=torch.randn(N,64,device=dev); W2=torch.randn(64,48,device=dev); G2=torch.randn(N,48,device=dev)
res['L2 h@W2']=ms(lambda: h@W2)
res['L2 G2@W2.t()']=ms(lambda: G2@W2.t())
res['L2 h.t()@G2']=ms(lambda: h.t()@G2)
res['L2 G2.t()@h']=ms(lambda: G2.t()@h)
print(json.dumps(res, indent=0))
