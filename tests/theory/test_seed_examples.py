"""Every consistent worked example of the seeds (/work/shared/seeds/*.txt) as a test of the theory
model. Each case names its seed file and quotes it; the tolerance is half a unit of the last
digit the seed prints. Examples that disagree with their own formula are in docs/conventions.md
and are tested there with their corrected values (test_inconsistent_examples_corrected)."""

import pytest

from jobs.schedules import simulate
from jobs.theory import (
    allreduce_algorithms,
    dp_bytes_per_rank,
    dp_collectives,
    gpt_activation_bytes_per_layer,
    model_state_bytes,
    predict,
)

B = 1_000_000_000  # parameters per "B"
GB = 1e9


def tol(stated: str) -> float:
    """Half a unit of the last printed digit of `stated`."""
    dec = len(stated.split(".")[1]) if "." in stated else 0
    return 0.5 * 10 ** -dec + 1e-12


def whatif(**kw):
    base = {"tp": 1, "pp": 1, "zero_stage": 0}
    return predict({**base, **kw})


# --- memory: per-rank model state (stage -> GB as the seed prints it) ---------------------------

MEMORY = [
    pytest.param(7 * B, 64, "20psi", {0: "140", 1: "29.75", 2: "15.97", 3: "2.19"},
                 id="s000-Q8-7B-N64-20psi '140 GB | 29.75 GB | 15.97 GB | 2.19 GB'"),
    pytest.param(7.5 * B, 64, "16psi", {0: "120", 1: "31.4", 2: "16.6", 3: "1.9"},
                 id="s001-7.5B-64GPU-16psi '约为120GB ... 31.4GB ... 16.6GB ... 1.9GB'"),
    pytest.param(1 * B, 4, "16psi", {0: "16", 1: "7", 2: "5.5", 3: "4"},
                 id="s003-1B-D4 '10亿参数、D=4,上述状态依次为 16、7、5.5、4GB'"),
    pytest.param(175 * B, 64, "16psi", {0: "2800", 3: "44"},
                 id="s000-GPT3-175B-64GPU 'ZeRO-3 = 44 GB', '基线 = 2.8 TB/GPU'"),
    pytest.param(340_000_000, 1, "16psi", {0: "5.4"},
                 id="s000-BERT-Large '340M | 5.4 GB'"),
    pytest.param(1.5 * B, 1, "16psi", {0: "24"}, id="s000-GPT-2 '1.5B | 24 GB'"),
    pytest.param(70 * B, 1, "16psi", {0: "1120"},
                 id="s002-LLaMA-70B '140 GB + 840 GB + 140 GB, 总计约 1.1 TB'"),
]


@pytest.mark.parametrize("psi,n,mm,expected", MEMORY)
def test_memory_examples(psi, n, mm, expected):
    for stage, stated in expected.items():
        out = whatif(params=int(psi), dp=n, zero_stage=stage, memory_model=mm)
        assert out["memory"]["per_rank_GB"] == pytest.approx(float(stated), abs=tol(stated))
        assert out["memory"]["by_zero_stage"][str(stage)] / GB == \
            pytest.approx(float(stated), abs=tol(stated))
        assert out["memory"]["components"]["activations"] == 0  # model state only


def test_s000_q8_breakdown():
    # seed 000 Q8: "ZeRO-1 | 4Ψ + 16Ψ/N | 28 GB + 1.75 GB", "ZeRO-2 | 2Ψ + 18Ψ/N | 14 GB + 1.97 GB"
    z1 = whatif(params=7 * B, dp=64, zero_stage=1, memory_model="20psi")["memory"]["components"]
    assert (z1["params"] + z1["grads"]) / GB == 28 and z1["optimizer"] / GB == 1.75
    z2 = whatif(params=7 * B, dp=64, zero_stage=2, memory_model="20psi")["memory"]["components"]
    assert z2["params"] / GB == 14
    assert (z2["grads"] + z2["optimizer"]) / GB == pytest.approx(1.97, abs=0.005)


def test_s002_llama70b_components_and_gpus():
    # seed 002: "参数：70B × 2 bytes = 140 GB", "优化器（AdamW）：70B × 12 bytes = 840 GB",
    # "梯度：70B × 2 bytes = 140 GB", "需要 14+ 张 A100-80GB GPU"
    c = whatif(params=70 * B, dp=1, memory_model="16psi")["memory"]["components"]
    assert (c["params"], c["optimizer"], c["grads"]) == (140 * GB, 840 * GB, 140 * GB)
    assert sum(c.values()) / (80 * GB) == 14


def test_s002_gpt3_fp16_params():
    # seed 002: "GPT-3 175B 参数模型，仅存储参数就需要 350GB 显存（FP16）"
    c = whatif(params=175 * B, dp=1, memory_model="16psi")["memory"]["components"]
    assert c["params"] / GB == 350


def test_s000_gpt3_needs_35_a100():
    # seed 000: "GPT-3 (2020) | 175B | 2.8 TB | 35+ A100-80GB GPU"
    total = whatif(params=175 * B, dp=1, memory_model="16psi")["memory"]["per_rank_bytes"]
    assert total / (80 * GB) == 35


@pytest.mark.parametrize("stage,mem_m,ratio", [
    pytest.param(1, 7, "2.3", id="s000-ZeRO1-N4 '内存 = 7M vs 基线 16M —— 2.3 倍减少'"),
    pytest.param(2, 5.5, "2.9", id="s000-ZeRO2-N4 '内存 = 5.5M —— 2.9 倍减少'"),
])
def test_s000_zero_n4_in_units_of_m(stage, mem_m, ratio):
    c = model_state_bytes(1, 4, stage)  # Ψ = 1 element: bytes are "M" units
    assert sum(c.values()) == mem_m
    assert 16 / sum(c.values()) == pytest.approx(float(ratio), abs=tol(ratio))


@pytest.mark.parametrize("stage,limit", [
    pytest.param(1, 4, id="s002-ZeRO1 '优化器状态 | 4x' (N -> inf)"),
    pytest.param(2, 8, id="s002-ZeRO2 '优化器状态 + 梯度 | 8x' (N -> inf)"),
])
def test_s002_savings_limits(stage, limit):
    big = model_state_bytes(1, 10**9, stage)
    assert 16 / sum(big.values()) == pytest.approx(limit, rel=1e-6)


def test_s002_zero3_saving_is_n():
    # seed 002: "ZeRO-3 | ... | Nx"
    for n in (2, 4, 64):
        assert 16 / sum(model_state_bytes(1, n, 3).values()) == pytest.approx(n)


def test_s002_zero3_four_gpu_diagram():
    # seed 002: "GPU 0: 完整参数 8B + 完整梯度 8B + 优化器 24B = 40B" (DP) and
    # "参数1/4 2B + 梯度1/4 2B + 优化器1/4 6B = 10B" (ZeRO-3), "总显存: 160B", "40B 节省 4x".
    # Its bytes per parameter are its own (2 + 2 + 6 for 4 parameters), passed explicitly.
    kw = {"bytes_params": 2, "bytes_grads": 2, "bytes_optimizer": 6}
    dp = model_state_bytes(4, 4, 0, **kw)
    z3 = model_state_bytes(4, 4, 3, **kw)
    assert (dp["params"], dp["grads"], dp["optimizer"], sum(dp.values())) == (8, 8, 24, 40)
    assert (z3["params"], z3["grads"], z3["optimizer"], sum(z3.values())) == (2, 2, 6, 10)
    assert 4 * sum(dp.values()) == 160 and 4 * sum(z3.values()) == 40


def test_s002_memory_range_8_to_16():
    # seed 002: "优化器状态 4N-12N bytes", "总计 8N-16N bytes"
    assert sum(model_state_bytes(1, 1, 0, bytes_optimizer=4).values()) == 8
    assert sum(model_state_bytes(1, 1, 0, bytes_optimizer=12).values()) == 16


# --- communication -------------------------------------------------------------------------------

COMM = [
    pytest.param(4, 2, 25, "3", "120",
                 id="s003 '每 rank 发送 2×3/4×2=3GB ... 3/25=0.12s,即 120ms'"),
    pytest.param(4, 2, 12.5, "3", "240", id="s003 '第一题发送仍为 3GB,下界变成 240ms'"),
    pytest.param(8, 4, 50, "7", "140", id="s003 '陌生配置发送 2×7/8×4=7GB,下界 140ms'"),
]


@pytest.mark.parametrize("n,grad_gb,bw,sent_gb,ms", COMM)
def test_ring_bytes_and_time(n, grad_gb, bw, sent_gb, ms):
    out = whatif(params=grad_gb * B // 2, grad_bytes=2, dp=n, memory_model="16psi",
                 bandwidth_GBps=bw)
    assert out["comm"]["bytes_per_rank"] / GB == pytest.approx(float(sent_gb), abs=tol(sent_gb))
    assert out["comm"]["time_lower_bound_s"] * 1000 == pytest.approx(float(ms), abs=tol(ms))


def test_s003_speedup_without_overlap():
    # seed 003: "在一张卡上计算 400ms,在四张卡上各算 100ms,通信再花 120ms且完全不重叠,总步时就是
    # 220ms,加速仅 400/220≈1.82 倍,效率约 45.5%"
    out = whatif(params=B, grad_bytes=2, dp=4, memory_model="16psi", bandwidth_GBps=25,
                 compute_ms=400)
    st = out["step"]
    assert st["per_rank_compute_s"] == pytest.approx(0.1)
    assert st["time_no_overlap_s"] == pytest.approx(0.22)
    assert st["speedup_no_overlap"] == pytest.approx(1.82, abs=0.005)
    assert st["efficiency_no_overlap"] * 100 == pytest.approx(45.5, abs=0.05)
    # full overlap: the step is bounded by the 120 ms of communication
    assert st["time_full_overlap_s"] == pytest.approx(0.12)
    assert st["speedup_full_overlap"] == pytest.approx(400 / 120)


def test_s001_ddp_per_phase_and_total():
    # seed 001: "scatter reduce 阶段，每个 GPU 发送和接收到的通信量都是 (N-1) × (φ / N)",
    # "DDP 架构下每个进程总的发送和接收通信量都是 2φ"
    n, phi = 3, 9.0
    ops = dp_collectives(phi, n, 0)
    assert ops == [("all_reduce", phi, n, 1)]
    assert dp_bytes_per_rank(phi, n, 0, 1)["value"] == 2 * (n - 1) * phi / n
    assert dp_bytes_per_rank(phi, n, 0, 1, convention="asymptotic")["value"] == 2 * phi


@pytest.mark.parametrize("stage,ratio", [
    pytest.param(1, 1.0, id="s001 'ZeRO-1 ... 总的发送和接收通信量和标准的 DDP 一样，都是 2φ'"),
    pytest.param(2, 1.0, id="s001 'ZeRO-2 ... 通讯量也没有改变'"),
    pytest.param(3, 1.5, id="s001 '总的发送和接收的通信量为 3φ，也就是标准 DDP 的 1.5 倍'"),
])
def test_zero_traffic_vs_ddp(stage, ratio):
    for n in (2, 4, 64):
        for conv in ("ring-exact", "asymptotic"):
            base = dp_bytes_per_rank(1e9, n, 0, 2, convention=conv)["value"]
            assert dp_bytes_per_rank(1e9, n, stage, 2, convention=conv)["value"] == \
                pytest.approx(ratio * base)


def test_s000_q7_zero3_is_3m():
    # seed 000 Q7: "| 总计 | 3M |", "比率：3M/2M = 1.5× 基线"
    assert dp_bytes_per_rank(1.0, 10**9, 3, 1, convention="asymptotic")["value"] == 3
    assert dp_bytes_per_rank(1.0, 10**9, 3, 1)["value"] == pytest.approx(3)


def test_s004_zero_collectives():
    # seed 004: ZeRO-1 "ReduceScatter梯度 → 通信量 #params", "AllGather参数 → 通信量 #params";
    # ZeRO-3 "2次 all-gather + 1次 reduce-scatter = 3×#params"; naive DP "传输 2×#params"
    assert [o[0] for o in dp_collectives(1, 8, 1)] == ["reduce_scatter", "all_gather"]
    assert dp_collectives(1, 8, 3) == [("all_gather", 1, 8, 2), ("reduce_scatter", 1, 8, 1)]
    for stage, k in ((0, 2), (1, 2), (3, 3)):
        assert dp_bytes_per_rank(1.0, 8, stage, 1, convention="asymptotic")["value"] == k


def test_s000_seed_table_convention():
    # seed 000 通信对比: "基线 DP ... 2M", "ZeRO-1 ... 4M", "ZeRO-2 ... 4M", "ZeRO-3 ... 4M"
    got = [dp_bytes_per_rank(1.0, 8, z, 1, convention="seed000-table")["value"] for z in range(4)]
    assert got == [2, 4, 4, 4]
    out = whatif(params=B, dp=8, zero_stage=3, memory_model="16psi",
                 comm_convention="seed000-table")
    assert out["comm"]["bytes_per_rank"] == 4 * 2 * B
    assert "seed 000" in out["conventions"]["comm"]


def test_s002_70b_allreduce_280gb():
    # seed 002: "AllReduce 操作的通信量：2×(N-1)/N×D", "70B 模型，每次 AllReduce 需要传输约 280GB
    # 数据（FP16）" (the N -> inf limit)
    out = whatif(params=70 * B, dp=1024, memory_model="16psi", comm_convention="asymptotic")
    assert out["comm"]["bytes_per_rank"] / GB == 280
    exact = whatif(params=70 * B, dp=1024, memory_model="16psi")["comm"]["bytes_per_rank"]
    assert exact == pytest.approx(2 * 1023 / 1024 * 140 * GB)


def test_s004_allreduce_bandwidth_formula():
    # seed 004: "sent_bytes = size_bytes * 2 * (world_size - 1)", "total_duration = world_size *
    # duration": the theory's per-rank bytes times world size is that sent_bytes
    size, ws = 1 << 20, 8
    per_rank = dp_bytes_per_rank(size, ws, 0, 1)["value"]
    assert per_rank * ws == size * 2 * (ws - 1)


N8 = 8


@pytest.mark.parametrize("algo,total,table,steps,bottleneck", [
    pytest.param("ps-dedicated", 2 * N8, 2 * N8, 2, "server",
                 id="s000 '参数服务器 | 2NM | 2 | 服务器瓶颈'"),
    pytest.param("naive", N8 * (N8 - 1), N8 * (N8 - 1), 1, "quadratic",
                 id="s000 '朴素 AllReduce | N(N-1)M | 1 | 二次扩展'"),
    pytest.param("ring", 2 * (N8 - 1), 2 * N8, 2 * (N8 - 1), "balanced",
                 id="s000 'Ring AllReduce | 2NM | 2(N-1) | 均衡' (exact 2(N-1)M)"),
    pytest.param("tree", 2 * (N8 - 1), 2 * N8, 6, "root",
                 id="s000 'Tree AllReduce | 2NM | 2log2 N | 根节点瓶颈' (exact 2(N-1)M)"),
    pytest.param("butterfly", N8 * 3, N8 * 3, 3, "balanced",
                 id="s000 'Butterfly AllReduce | NMlog2 N | log2 N | 均衡'"),
])
def test_s000_allreduce_table(algo, total, table, steps, bottleneck):
    rows = {r["algorithm"]: r for r in allreduce_algorithms(N8, 1.0)}
    r = rows[algo]
    assert r["total_volume"] == pytest.approx(total)
    assert r["table_volume"] == pytest.approx(table)
    assert r["steps"] == steps
    assert bottleneck in r["bottleneck"]


def test_s000_ring_per_worker_and_tree_reduce_phase():
    # seed 000: ring "每个工作器总量：2(N-1) × M/N", tree "Σ N/2^i × M = (N-1)M" per phase,
    # naive "每工作器通信量 (N-1)M"
    rows = {r["algorithm"]: r for r in allreduce_algorithms(16, 1.0)}
    assert rows["ring"]["max_per_worker"] == pytest.approx(2 * 15 / 16)
    assert sum(16 / 2**i for i in range(1, 5)) == rows["tree"]["total_volume"] / 2
    assert rows["naive"]["max_per_worker"] == 15


def test_s001_parameter_server_on_gpu0():
    # seed 001: "传入梯度的通信量为 (N-1) × φ ... 传出的通信量也是 (N-1) × φ",
    # "其他 GPU ... 传出自己的梯度，通信量为 φ"
    n, phi = 5, 1.0
    rows = {r["algorithm"]: r for r in allreduce_algorithms(n, phi)}
    assert rows["ps-rank0"]["max_per_worker"] == (n - 1) * phi
    d = dp_bytes_per_rank(phi, n, 0, 1, dp_mode="ps")
    assert d["per_role"] == {"server": (n - 1) * phi, "worker": phi}


# --- pipeline ------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule,v,expected", [
    pytest.param("gpipe", 1, lambda p, m, v: (p - 1) / m,
                 id="s000 GPipe 'BubbleFraction = (p-1)/m'"),
    pytest.param("1f1b", 1, lambda p, m, v: (p - 1) / m,
                 id="s000 1F1B '相同的气泡分数：(p-1)/m'"),
    pytest.param("interleaved", 2, lambda p, m, v: (p - 1) / m / v,
                 id="s000 interleaved 'BubbleFraction_interleaved = 1/v × (p-1)/m'"),
])
def test_seed_bubble_over_ideal(schedule, v, expected):
    for p, m in ((2, 4), (4, 8), (4, 16)):
        out = whatif(params=B, dp=1, pp=p, memory_model="16psi", pp_schedule=schedule,
                     microbatches=m, virtual_stages=v, bubble_convention="ideal")
        assert out["pipeline"]["bubble_fraction"] == pytest.approx(expected(p, m, v))
        assert "ideal" in out["pipeline"]["convention"]


def test_s002_bubble_over_total_formula():
    # seed 002: "气泡率 Bubble Ratio = P-1 / P-1 + M"; "计算公式：(P-1)/(P-1+M)"
    for p, m in ((4, 4), (4, 8), (8, 32)):
        out = whatif(params=B, dp=1, pp=p, memory_model="16psi", microbatches=m)
        assert out["pipeline"]["bubble_fraction"] == pytest.approx((p - 1) / (p - 1 + m))
        assert "total" in out["pipeline"]["convention"]


def test_s004_bubble_stages_over_micro():
    # seed 004: "气泡时间比例 = (n_stages - 1) / n_micro"
    out = simulate("1f1b", 4, 4)
    assert out["bubble_over_ideal"] == pytest.approx(3 / 4)


def test_s000_m_ge_4p_bubble_le_25pct():
    # seed 000: "典型配置：选择 m ≥ 4p 以实现气泡分数 ≤ 25%" (over ideal time)
    for p in (2, 4, 8, 16):
        out = whatif(params=B, dp=1, pp=p, memory_model="16psi", microbatches=4 * p,
                     bubble_convention="ideal")
        assert out["pipeline"]["bubble_fraction"] <= 0.25


def test_s002_3d_example_device_count():
    # seed 002: "示例：128 GPU，张量并行=8，流水线并行=4，数据并行=4"
    out = whatif(params=B, dp=4, tp=8, pp=4, memory_model="16psi", microbatches=4)
    assert out["step"]["devices"] == 128


# --- activations ---------------------------------------------------------------------------------

def test_s004_activation_terms():
    # seed 004: "二次注意力项（含dropout）：5as/h", "剩余项（10sbh）: LayerNorm 4sbh, Dropout 2sbh,
    # Attention/MLP输入 4sbh"; with TP the 10sbh stays, the rest is divided by t
    s, b, h, a = 128, 2, 64, 4
    full, _ = gpt_activation_bytes_per_layer(s, b, h, a)
    assert full == s * b * h * (34 + 5 * a * s / h)
    big_t, _ = gpt_activation_bytes_per_layer(s, b, h, a, tp=1 << 20)
    assert big_t == pytest.approx(10 * s * b * h, rel=1e-4)


def test_s004_sequence_parallel_scales_linearly():
    # seed 004: "效果： 激活内存也随机器数线性扩展！"
    full, _ = gpt_activation_bytes_per_layer(64, 2, 64, 4)
    for t in (2, 4, 8):
        sp, _ = gpt_activation_bytes_per_layer(64, 2, 64, 4, tp=t, sequence_parallel=True)
        assert sp == pytest.approx(full / t)
