"""Step names and the "why this matters / common pitfall" panels, English and Chinese.

Written for this tool from the baseline and comparison checklists the project
started from (fix the inputs, build an FP32 unfused baseline layer by layer,
check it runs the same twice and holds no NaN/Inf, pick metrics that fit the
output, compare distributions, not only one number).
"""

from __future__ import annotations

STEPS: tuple[tuple[str, str, str], ...] = (
    # id, English name, Chinese name
    ("inputs", "Model & input", "模型与输入"),
    ("baseline", "Baseline", "基线"),
    ("determinism", "Determinism", "确定性"),
    ("range_check", "Range check", "数值范围"),
    ("settings", "Engine settings", "引擎设置"),
    ("fused", "Comparison", "精度对比"),
    ("bisect", "Bisection", "二分定位"),
)
STEP_IDS = tuple(s[0] for s in STEPS)
STEP_NAME = {s[0]: s[1] for s in STEPS}
STEP_NAME_ZH = {s[0]: s[2] for s in STEPS}

TITLE = {
    "en": "Why this matters / common pitfall",
    "zh": "为什么重要 / 常见坑",
}
TOGGLE_HINT = {"en": "l: 中文", "zh": "l: English"}

WHY: dict[str, dict[str, tuple[str, str]]] = {
    "inputs": {
        "en": (
            "Every number further down compares two runs on the same inputs. If the baseline "
            "and the fused engine see different data, the difference you measure is the data, "
            "not the fusion.",
            "Not keeping the inputs. Pin a seed or load a saved .npy/.npz, and check shapes, "
            "dtypes and batch order before anything else; a dynamic dimension left to chance "
            "changes the whole comparison.",
        ),
        "zh": (
            "后面所有的对比都建立在“两边用的是同一份输入”上。输入不同，测出来的差异来自数据本身，"
            "而不是融合。",
            "忘了保存输入。固定随机种子，或者把输入存成 .npy/.npz 反复使用；先核对形状、数据类型"
            "和 batch 顺序，动态维度不要靠运气。",
        ),
    },
    "baseline": {
        "en": (
            "The baseline is the reference answer: the model run with every fusion switched off "
            "in FP32, with every layer's output saved. With only the final "
            "output you know that the result is wrong, not where it starts; one fused op can "
            "stand for several original layers.",
            "A baseline in FP16 already carries rounding error; dumping every tensor of a big "
            "model at once runs out of memory (dump in groups within a budget); files named "
            "out1.npy, out2.npy... get lost: name each dump by layer index, op and tensor.",
        ),
        "zh": (
            "基线就是“标准答案”：关闭所有融合、用 FP32 跑一遍，并保存每一层的"
            "输出。只有最终输出，你只知道结果错了，却不知道从哪一层开始错；一个融合算子可能对应原"
            "模型的好几层。",
            "用 FP16 跑基线，基线本身就带误差；大模型一次性保存所有中间结果会内存爆炸（按内存预算"
            "分批保存）；out1.npy、out2.npy 这样的文件名最后谁也分不清，按“层序号_算子_张量”命名。",
        ),
    },
    "determinism": {
        "en": (
            "If two identical runs of the baseline disagree, run-to-run noise and fusion error "
            "cannot be told apart, and every verdict after this one means nothing.",
            "Random ops left active (Dropout in training mode, RandomNormal), a model exported "
            "outside eval mode, reductions that depend on the thread count. Fix or pin them "
            "before comparing engines.",
        ),
        "zh": (
            "同一个基线跑两次结果不一样，就分不清是随机波动还是融合误差，后面的结论都不可信。",
            "随机算子没关（训练模式的 Dropout、RandomNormal），导出模型时没切到 eval 模式，归约"
            "结果随线程数变化。先修好或固定住，再去对比引擎。",
        ),
    },
    "range_check": {
        "en": (
            "A baseline that already holds NaN or Inf cannot judge anything. Values close to "
            "FP16's limit (65504) overflow, and values below its smallest step flush to zero, "
            "as soon as the engine runs in half precision. The magnitude histogram shows where "
            "a tensor's values sit on a log2 scale.",
            "Blaming a fusion for what the precision does. Look at the headroom first: a tensor "
            "with little room needs FP32 or rescaling, not a bisection.",
        ),
        "zh": (
            "基线里已经有 NaN/Inf，就不能当标准答案。数值接近 FP16 上限（65504）会溢出，小于其"
            "最小精度会变成 0，引擎一用半精度就出问题。幅值直方图按 log2 刻度显示张量数值落在哪里。",
            "把精度造成的问题算到融合头上。先看余量：余量很小的张量需要 FP32 或重新缩放，而不是"
            "二分查找。",
        ),
    },
    "settings": {
        "en": (
            "The fused engine must be the one you ship: same optimization level, precision and "
            "session options as production, or the check tests something else. The tolerance "
            "says what 'broken' means: absolute error for regression values, relative error "
            "when magnitudes vary a lot, cosine for embeddings, top-k for classes.",
            "A tiny value can look fine in absolute error while its relative error has "
            "exploded; FP16 output subtracted from FP32 without converting first makes honest "
            "rounding look like a bug. An optimizer name the installed engine does not know is "
            "silently ignored, so names are checked here.",
        ),
        "zh": (
            "融合引擎必须是你要上线的那个：优化级别、精度、会话配置都和生产一致，否则测的是别的"
            "东西。容差决定什么叫“坏了”：回归值看绝对误差，数值范围差异大看相对误差，向量看余弦"
            "相似度，分类看 Top-K。",
            "数值很小时绝对误差看着正常，相对误差可能早已爆掉；FP16 输出不先转成 FP32 就直接相减，"
            "正常的舍入也像 bug。引擎不认识的优化器名字会被静默忽略，所以这里会校验名字。",
        ),
    },
    "fused": {
        "en": (
            "This is the verdict: each output of the fused engine against the baseline, "
            "criterion by criterion. The histograms put the two value distributions side by "
            "side: if they coincide the engine is fine; a shift or a long error tail says "
            "where to look.",
            "Post-processing on one side only (softmax on one output, not the other); outputs "
            "in another batch order; chasing zero error. The goal is error within a bound that "
            "does not change the task's result. Rerun this on every engine upgrade or config "
            "change: it fits in CI.",
        ),
        "zh": (
            "这是结论：融合引擎的每个输出与基线逐项指标对比。直方图把两边的数值分布放在一起："
            "基本重合说明没问题；明显偏移或误差长尾说明要往下查。",
            "只有一边做了后处理（一边有 softmax 一边没有）；多 batch 输出顺序不一致；追求“误差为零”。"
            "目标是误差在可接受范围内、不影响最终任务效果。引擎升级或配置变化都要重跑，适合放进 CI。",
        ),
    },
    "bisect": {
        "en": (
            "A failing output says that something broke, not which fusion. The bisection "
            "rebuilds the engine with only some fusions allowed (the others blocked by marking "
            "their tensors as outputs) and halves the candidates each time: about log2(n) builds "
            "name the fused op, the original nodes it replaced and the optimizer that made it.",
            "Tuning the fused kernel before proving it is the cause. The culprit is rerun alone "
            "against float64 truth: only when the fused result is worse than plain FP32 is it a "
            "fusion bug; the workaround disables just that optimizer.",
        ),
        "zh": (
            "输出不达标只说明有东西坏了，不说明是哪个融合。二分查找每次只放开一部分融合（其余通过"
            "把张量标为输出来阻止），候选减半，大约 log2(n) 次构建就能定位融合算子、它替换的原始"
            "节点以及生成它的优化器。",
            "还没证明是它，就去调融合后的算子。定位到的算子会单独和 float64 真值对比：只有融合结果"
            "比普通 FP32 更差，才是真正的融合问题；规避办法只禁用那一个优化器。",
        ),
    },
}

LABELS = {
    "en": ("Why this matters", "Common pitfall"),
    "zh": ("为什么重要", "常见坑"),
}

HELP_TITLE = "bisect-tui: find the fused operator that breaks numerical tolerance"

# (section, ((keys, what they do), ...)): one key per row, so the help screen
# wraps each description at word boundaries beside its key, at any width
HELP_SECTIONS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Checklist (the first screen on a model)", (
        ("up/down", "choose a step"),
        ("tab / shift+tab", "move focus (the focused pane has a heavy border)"),
        ("r", "run the next step"),
        ("a", "run all checks"),
        ("o", "settings: inputs (shapes, fixed values, input file, seed), engine, tolerance"),
        ("b", "bisect (runs what is missing first)"),
        ("f", "the focused table (and the error along the graph) full screen"),
        ("w", "hide/show the why panel (tables get the width)"),
        ("p", "save the selected output's baseline/fused histograms as a PNG"),
        ("e", "export report.md, report.json and plots/ into the session, with bundle.zip "
              "when there is a repro to bundle"),
        ("c", "export and copy the Markdown report to the clipboard (OSC 52)"),
        ("x", "cancel the running work (what is written stays valid)"),
        ("m", "open another model or session"),
    )),
    ("Bisection", (
        ("r", "run / resume the search (recorded steps are reused)"),
        ("tab", "move between the steps and the culprit"),
        ("f", "the focused pane full screen (f again restores)"),
        ("x", "cancel"),
        ("h / escape", "back to the checklist"),
        ("e / c", "export / copy the report"),
    )),
    ("Everywhere", (
        ("s", "save an SVG screenshot into the session directory"),
        ("l", "switch the explanations between English and Chinese"),
        ("?", "this help"),
        ("ctrl+p", "every action by name"),
        ("q", "quit"),
    )),
)

HELP_STATES: tuple[tuple[str, str], ...] = (
    ("· pending", "not run yet"),
    ("… running", "running now"),
    ("✔ passed", "within tolerance, nothing to read"),
    ("⚠ warning", "passed, with a finding to read (e.g. FP16 will overflow)"),
    ("✘ failed", "broke tolerance or stopped"),
    ("– skipped", "not run, by choice"),
    ("✔ found", "the bisection named its culprit"),
    ("? unclear", "no single culprit"),
)
HELP_CLOSE = "Close this help with escape, enter, ? or q."


def help_plain() -> str:
    """The help as plain text (one key per line), for a log or a terminal without the app."""
    lines = [HELP_TITLE, ""]
    for title, rows in HELP_SECTIONS:
        lines += [title, *[f"  {key:<16} {what}" for key, what in rows], ""]
    lines += ["States (symbol and word, never colour alone)", *[f"  {key:<16} {what}" for key, what in HELP_STATES]]
    return "\n".join([*lines, "", HELP_CLOSE]) + "\n"


HELP_TEXT = help_plain()
