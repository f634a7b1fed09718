"""Write the sample logs of trajectories/samples/: the same small set of agent episodes laid out the way
each framework writes its own logs, for `mpo-viz convert` and the adapters notebook.

The episodes: 4 tool-use episodes of the scripted noisy expert (mpo_viz.envs, `tooluse`, 2 tasks x 2
samples, noise 0.5, 2-3 calculator calls needed, seed 0; two succeed, two fail), with a shaping reward
of 0.1 carried by every tool reply that confirms progress and the outcome (1 on success) carried by
the final reply. Each file says the same thing in
its framework's words:

    tokenizer/                       the environment's word-level tokenizer with its chat template
    verl_batch.pt                    verl DataProto keys as a torch.save'd dict (tensors + lists)
    areal_rollout.safetensors        an AReaL rollout batch (padded tensors, safetensors) with the
                                     critic's values, sampled log-probs and weight versions
    skyrl_generator_output.json      a SkyRL GeneratorOutput
    verifiers_rollouts.jsonl         verifiers rollouts (State with TrajectoryStep tokens), one per line
    rllm_episodes.jsonl              rLLM Episode.to_dict(), one per line (one task re-renders its
                                     history, so its steps cannot be merged)
    agl_rollouts.jsonl               agent-lightning completed rollouts (triplets)
    openai_chat.jsonl                OpenAI-style chat with logged assistant token ids
    trl/completions_00010.parquet    TRL GRPO completion log (text)
    art/trajectories/train/0003.parquet   ART trajectory Parquet (format 2)

Run from the repository root: `python trajectories/samples/make_samples.py [OUT_DIR]`. The output is
a deterministic function of this script; tests/adapters/test_samples.py regenerates it and compares.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import save_file

from mpo_viz.envs.generate import GenerateConfig, generate_rows
from mpo_viz.envs.registry import make_env
from mpo_viz.envs.tokenizer import build_tokenizer

CFG = GenerateConfig(
    env="tooluse", noise=0.5, episodes=4, group_size=2, seed=0, difficulty=(2, 3), env_options={"shaping": 0.1}
)


def episodes():
    """The generated rows, each with its messages, turn spans and the reward each tool reply carries."""
    rows, meta = generate_rows(CFG)
    out = []
    for r in rows:
        msgs = json.loads(r["messages_json"])
        mask = np.asarray(r["loss_mask"])
        # action runs = turns; turn_rewards[k] arrives with the tool reply after turn k
        starts = np.flatnonzero(np.diff(np.concatenate([[0], mask])) == 1)
        ends = np.flatnonzero(np.diff(np.concatenate([mask, [0]])) == -1) + 1
        tr = list(r["turn_rewards"])
        a = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        for k, i in enumerate(a):
            # the last reply always says its reward, 0 included: a log without any reward is flagged
            if i + 1 < len(msgs) and (tr[k] or k == len(a) - 1):
                msgs[i + 1]["reward"] = round(tr[k], 6)
        out.append(
            dict(
                row=r,
                messages=msgs,
                starts=starts.tolist(),
                ends=ends.tolist(),
                turn_rewards=tr,
                task=r["group_id"],
                sample=int(r["sample_idx"]),
            )
        )
    return out, meta


def write_tokenizer(out: Path):
    tok = build_tokenizer(make_env("tooluse"))
    tok.save_pretrained(str(out / "tokenizer"))
    return tok


def write_verl(eps, out: Path):
    B = len(eps)
    P = max(len(e["row"]["prompt_ids"]) for e in eps)
    R = max(len(e["row"]["response_ids"]) for e in eps)
    prompts = torch.zeros(B, P, dtype=torch.long)  # pad id 0, left padding (verl's agent loop)
    responses = torch.zeros(B, R, dtype=torch.long)
    attn = torch.zeros(B, P + R, dtype=torch.long)
    rmask = torch.zeros(B, R, dtype=torch.long)
    scores = torch.zeros(B, R, dtype=torch.float32)
    values = torch.zeros(B, R, dtype=torch.float32)
    for i, e in enumerate(eps):
        r = e["row"]
        p, x = r["prompt_ids"], r["response_ids"]
        prompts[i, P - len(p) :] = torch.tensor(p)
        attn[i, P - len(p) : P] = 1
        responses[i, : len(x)] = torch.tensor(x)
        attn[i, P : P + len(x)] = 1
        m = torch.tensor(r["loss_mask"])
        rmask[i, : len(x)] = m
        values[i, : len(x)] = torch.tensor(r["values"]) * m  # verl zeroes values on observation tokens
        # each tool reply's reward on its last token (an observation token), as a tool reward written into
        # the token-level scores; the outcome is on the last valid token like verl's rm_scores
        for k in range(len(e["ends"])):
            nxt = e["starts"][k + 1] if k + 1 < len(e["starts"]) else len(x)
            scores[i, nxt - 1] += e["turn_rewards"][k]
    batch = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": rmask,
        "attention_mask": attn,
        "input_ids": torch.cat([prompts, responses], 1),
        "position_ids": torch.clamp(torch.cumsum(attn, 1) - 1, min=0),
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
        "values": values,
        "uid": [e["task"] for e in eps],
        "request_id": [e["row"]["traj_id"] for e in eps],
        "__num_turns__": [len(e["messages"]) - 1 for e in eps],
        "data_source": ["tooluse"] * B,
    }
    torch.save(batch, out / "verl_batch.pt")


def write_areal(eps, out: Path):
    """AReaL's rollout batch: each workflow's (1, L) tensors over prompt + completion (token t at
    position t; -1 turn ids and versions off the generated tokens, areal/workflow/multi_turn.py),
    right-padded (concat_padded_tensors), with the critic's values as AReaL's forward pass holds them
    (token t's value at position t - 1). The log-probs are made up (seeded); two weight versions,
    the later one from the second turn on in odd rows (asynchronous rollouts)."""
    B = len(eps)
    L = max(len(e["row"]["prompt_ids"]) + len(e["row"]["response_ids"]) for e in eps)
    g = np.random.default_rng(0)
    cols = {k: np.zeros((B, L), dtype=np.int32) for k in ("input_ids", "loss_mask", "versions", "turn_ids")}
    attn = np.zeros((B, L), dtype=bool)
    logprobs = np.zeros((B, L), dtype=np.float32)
    values = np.zeros((B, L), dtype=np.float32)
    for i, e in enumerate(eps):
        r = e["row"]
        p, n = len(r["prompt_ids"]), len(r["prompt_ids"]) + len(r["response_ids"])
        m = np.asarray(r["loss_mask"])
        tid = np.asarray(r["turn_ids"])
        cols["input_ids"][i, :n] = r["prompt_ids"] + r["response_ids"]
        cols["loss_mask"][i, p:n] = m
        cols["turn_ids"][i, :n] = -1
        cols["turn_ids"][i, p:n] = np.where(m == 1, tid, -1)
        cols["versions"][i, :n] = -1
        cols["versions"][i, p:n] = np.where(m == 1, 3 + ((tid >= 1) & (i % 2 == 1)), -1)
        attn[i, :n] = True
        logprobs[i, p:n] = np.where(m == 1, -g.exponential(0.5, len(m)).round(4), 0.0)
        values[i, p - 1 : n - 1] = r["values"]
    batch = {k: torch.from_numpy(v) for k, v in cols.items()}
    batch.update(
        attention_mask=torch.from_numpy(attn),
        logprobs=torch.from_numpy(logprobs),
        values=torch.from_numpy(values),
        rewards=torch.tensor([round(sum(e["turn_rewards"]), 6) for e in eps], dtype=torch.float32),
    )
    save_file(batch, str(out / "areal_rollout.safetensors"))


def write_skyrl(eps, out: Path):
    rewards = []
    for e in eps:
        r = [0.0] * len(e["row"]["response_ids"])
        for k, end in enumerate(e["ends"]):  # SkyRL puts each step's reward on the turn's last token
            r[end - 1] += round(e["turn_rewards"][k], 6)
        rewards.append(r)
    gen = {
        "prompt_token_ids": [e["row"]["prompt_ids"] for e in eps],
        "response_ids": [e["row"]["response_ids"] for e in eps],
        "rewards": rewards,
        "loss_masks": [e["row"]["loss_mask"] for e in eps],
        "stop_reasons": ["stop" for _ in eps],
        "rollout_metrics": {"generate/avg_num_tokens": float(np.mean([len(e["row"]["response_ids"]) for e in eps]))},
        "rollout_logprobs": None,
        "trajectory_ids": [{"instance_id": e["task"], "repetition_id": e["sample"]} for e in eps],
    }
    (out / "skyrl_generator_output.json").write_text(json.dumps(gen) + "\n")


def _steps(e):
    """(prompt ids, completion ids) of each LLM call of an episode."""
    r = e["row"]
    full = r["prompt_ids"] + r["response_ids"]
    p = len(r["prompt_ids"])
    return [(full[: p + s], full[p + s : p + t]) for s, t in zip(e["starts"], e["ends"])]


def _reward_after(e, k):
    return round(e["turn_rewards"][k], 6)


def write_verifiers(eps, out: Path):
    lines = []
    for e in eps:
        traj = []
        for k, (pr, co) in enumerate(_steps(e)):
            a = [i for i, m in enumerate(e["messages"]) if m["role"] == "assistant"][k]
            traj.append(
                {
                    "prompt": e["messages"][:a],
                    "completion": [e["messages"][a]],
                    "tokens": {
                        "prompt_ids": pr,
                        "prompt_mask": [0] * len(pr),
                        "completion_ids": co,
                        "completion_mask": [1] * len(co),
                        "completion_logprobs": None,
                        "overlong_prompt": False,
                        "is_truncated": False,
                    },
                    "reward": _reward_after(e, k) if k < len(e["turn_rewards"]) - 1 else None,
                    "advantage": None,
                    "is_truncated": False,
                    "trajectory_id": e["row"]["traj_id"],
                    "extras": {},
                }
            )
        lines.append(
            {
                "example_id": int(e["task"].rsplit("t", 1)[1]),
                "prompt": e["messages"][:2],
                "completion": e["messages"][2:],
                "reward": _reward_after(e, len(e["turn_rewards"]) - 1),
                "is_completed": True,
                "is_truncated": False,
                "stop_condition": "answered",
                "trajectory": traj,
            }
        )
    (out / "verifiers_rollouts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def write_rllm(eps, tok, out: Path):
    user = tok.convert_tokens_to_ids("<|user|>")
    by_task: dict = {}
    for e in eps:
        by_task.setdefault(e["task"], []).append(e)
    lines = []
    for n, (task, group) in enumerate(by_task.items()):
        for e in group:
            steps = []
            for k, (pr, co) in enumerate(_steps(e)):
                if n == 1 and k:  # this agent drops the system prompt from later calls (context management)
                    pr = pr[pr.index(user) :]
                steps.append(
                    {
                        "prompt_ids": pr,
                        "response_ids": co,
                        "logprobs": [],
                        "reward": _reward_after(e, k),
                        "done": k == len(e["starts"]) - 1,
                        "mc_return": 0.0,
                        "advantage": None,
                        "chat_completions": [],
                        "observation": None,
                        "thought": "",
                        "action": None,
                        "model_response": "",
                        "model_output": None,
                        "info": {},
                    }
                )
            lines.append(
                {
                    "id": f"{task}:{e['sample']}",
                    "task": {"name": task},
                    "termination_reason": "ENV_DONE",
                    "is_correct": bool(e["row"]["extra_json"] and json.loads(e["row"]["extra_json"])["success"]),
                    "trajectories": [
                        {
                            "uid": e["row"]["traj_id"],
                            "name": "solver",
                            "task": {"name": task},
                            "steps": steps,
                            "reward": round(sum(e["turn_rewards"]), 6),
                            "info": {},
                        }
                    ],
                    "metrics": {},
                    "info": {},
                }
            )
    (out / "rllm_episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def write_agl(eps, out: Path):
    lines = []
    for j, e in enumerate(eps):
        st = _steps(e)
        # agent-lightning keeps one final reward and copies it onto the last triplet
        final = round(sum(e["turn_rewards"]), 6)
        trip = [
            {
                "prompt": {"token_ids": pr},
                "response": {"token_ids": co, "log_probs": None},
                "reward": final if k == len(st) - 1 else None,
                "metadata": {},
            }
            for k, (pr, co) in enumerate(st)
        ]
        lines.append(
            {
                "rollout_id": f"ro-{e['row']['traj_id']}",
                "data_id": e["task"],
                "step": 10,
                "sample_idx_in_step": j,
                "final_reward": final,
                "triplets": trip,
            }
        )
    (out / "agl_rollouts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def write_openai(eps, tok, out: Path):
    eot = tok.convert_tokens_to_ids("<|eot|>")
    lines = []
    for j, e in enumerate(eps):
        msgs = [dict(m) for m in e["messages"]]
        r = e["row"]
        full = r["prompt_ids"] + r["response_ids"]
        p = len(r["prompt_ids"])
        a = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        for k, i in enumerate(a):
            msgs[i]["token_ids"] = full[p + e["starts"][k] : p + e["ends"][k]]
        if j == 3:  # the agent harness capitalized one reply after sampling: logged ids and text disagree
            i = a[0]
            msgs[i]["content"] = msgs[i]["content"][:1].upper() + msgs[i]["content"][1:]
        assert all(m["token_ids"][-1] == eot for m in msgs if "token_ids" in m)
        lines.append({"id": r["traj_id"], "group_id": e["task"], "messages": msgs})
    (out / "openai_chat.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def write_trl(eps, tok, out: Path):
    (out / "trl").mkdir(exist_ok=True)
    rows = []
    for e in eps:
        prompt = " ".join(m["content"] for m in e["messages"][:2])
        completion = " ".join(m["content"] for m in e["messages"][2:])
        success = float(json.loads(e["row"]["extra_json"])["success"])
        rows.append(
            {
                "step": 10,
                "prompt": prompt,
                "completion": completion,
                "correctness": success,
                "progress": round(sum(e["turn_rewards"]) - success, 6),
            }
        )
    for task in {r["prompt"] for r in rows}:
        g = [r for r in rows if r["prompt"] == task]
        s = np.array([r["correctness"] + r["progress"] for r in g])
        for r, a in zip(g, (s - s.mean()) / (s.std(ddof=1) + 1e-4)):
            r["advantage"] = float(a)
    pq.write_table(pa.Table.from_pylist(rows), out / "trl" / "completions_00010.parquet")


def write_art(eps, out: Path):
    d = out / "art" / "trajectories" / "train"
    d.mkdir(parents=True, exist_ok=True)
    groups: dict = {}
    for e in eps:
        groups.setdefault(e["task"], []).append(e)
    message_t = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.string()),
            ("tool_call_id", pa.string()),
            ("trainable", pa.bool_()),
        ]
    )
    schema = pa.schema(
        [
            ("format_version", pa.int16()),
            ("group_index", pa.int64()),
            ("trajectory_index", pa.int64()),
            ("group_json", pa.large_string()),
            ("trajectory_json", pa.large_string()),
            ("group_metadata", pa.string()),
            ("group_metrics", pa.string()),
            ("group_logs", pa.list_(pa.string())),
            ("reward", pa.float64()),
            ("metrics", pa.string()),
            ("metadata", pa.string()),
            ("tools", pa.string()),
            ("logs", pa.list_(pa.string())),
            ("messages", pa.list_(message_t)),
        ],
        metadata={b"art.trajectory_parquet.version": b"2"},
    )
    rows = []
    for gi, (task, group) in enumerate(groups.items()):
        for ti, e in enumerate(group):
            msgs = [
                {
                    "role": m["role"],
                    "content": m["content"],
                    "tool_calls": None,
                    "tool_call_id": None,
                    "trainable": m["role"] == "assistant",
                }
                for m in e["messages"]
            ]
            rows.append(
                {
                    "format_version": 2,
                    "group_index": gi,
                    "trajectory_index": ti,
                    "group_json": json.dumps({"metadata": {"task": task}}),
                    "trajectory_json": None,
                    "group_metadata": json.dumps({"task": task}),
                    "group_metrics": None,
                    "group_logs": None,
                    "reward": round(sum(e["turn_rewards"]), 6),
                    "metrics": json.dumps({"calls": len(e["starts"])}),
                    "metadata": None,
                    "tools": None,
                    "logs": None,
                    "messages": msgs,
                }
            )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), d / "0003.parquet", compression="zstd")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    eps, _ = episodes()
    tok = write_tokenizer(out)
    write_verl(eps, out)
    write_areal(eps, out)
    write_skyrl(eps, out)
    write_verifiers(eps, out)
    write_rllm(eps, tok, out)
    write_agl(eps, out)
    write_openai(eps, tok, out)
    write_trl(eps, tok, out)
    write_art(eps, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
