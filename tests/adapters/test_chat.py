"""OpenAI-style chat: tokens through the chat template (hand-computed ids of the word tokenizer),
logged ids kept, the retokenization report, tool-reply rewards moved, refusals."""

import json

import pytest

from mpo_viz import TrajectoryError
from mpo_viz.adapters import from_chat
from mpo_viz.data.token_text import load_local_tokenizer

SYSTEM = {"role": "system", "content": "you are an agent ."}
USER = {"role": "user", "content": "task : add 2 and 3"}
PROMPT = [2, 7, 8, 9, 10, 11, 6, 3, 12, 13, 14, 15, 16, 17, 6, 4]


def convo(first=None, **over):
    first = first or {
        "role": "assistant",
        "content": "calc 2 + 3",
        "token_ids": [20, 15, 21, 17, 6],
        "logprobs": [-0.5] * 5,
    }
    return {
        "id": "c0",
        "group_id": "task1",
        "score": 1.0,
        "messages": [
            SYSTEM,
            USER,
            first,
            {"role": "tool", "content": "result 5", "reward": 0.1},
            {"role": "assistant", "content": "answer 5"},
            {"role": "tool", "content": "correct", "reward": 0.5},
        ],
        **over,
    }


def test_hand_computed_tokens_and_rewards(tok_dir):
    b, rep = from_chat([convo()], tokenizer=tok_dir)
    r = b.row(0)
    assert r["traj_id"] == "c0" and r["group_id"] == "task1" and r["reward"] == 1.0
    assert r["prompt_ids"] == PROMPT
    #            calc 2 + 3 <eot> | <tool> result 5 <eot> <assistant> | answer 5 <eot> | <tool> correct <eot>
    assert r["response_ids"] == [20, 15, 21, 17, 6, 5, 22, 23, 6, 4, 25, 23, 6, 5, 26, 6]
    assert r["loss_mask"] == [1] * 5 + [0] * 5 + [1] * 3 + [0] * 3
    assert r["turn_ids"] == [0] * 10 + [1] * 6
    assert r["response_tokens"][:6] == ["calc", "2", "+", "3", "<|eot|>", "<|tool|>"]
    # both tool replies carry a reward: each moved to the assistant turn before it
    assert r["turn_rewards"] == [0.1, 0.5] and rep.rewards_moved == 2
    assert "rollout_logprobs" not in r  # the second assistant message has none
    assert any("some assistant messages only" in k for k in rep.notes)
    assert rep.retokenized_messages == 1 and rep.retokenization_mismatches == 0
    assert json.loads(r["messages_json"])[2] == {"role": "assistant", "content": "calc 2 + 3"}
    assert b.meta["tokenizer"] == tok_dir.name and b.meta["source_framework"] == "openai"


def test_logged_ids_are_kept_and_mismatches_reported(tok_dir):
    rows = [
        convo(),
        # the text says "3", the model generated "4": logged ids win, the mismatch is counted
        convo({"role": "assistant", "content": "calc 2 + 3", "token_ids": [20, 15, 21, 19, 6]}, id="c1"),
        # logged without the end-of-turn token: the template's <eot> follows as an observation token
        convo({"role": "assistant", "content": "calc 2 + 3", "token_ids": [20, 15, 21, 17]}, id="c2"),
        # vLLM return_tokens_as_token_ids: ids and log-probs from logprobs.content
        convo(
            {
                "role": "assistant",
                "content": "calc 2 + 3",
                "logprobs": {"content": [{"token": f"token_id:{i}", "logprob": -0.1} for i in (20, 15, 21, 17, 6)]},
            },
            id="c3",
        ),
    ]
    b, rep = from_chat(rows, tokenizer=tok_dir)
    assert b.row(1)["response_ids"][:5] == [20, 15, 21, 19, 6]
    assert b.row(2)["response_ids"][:6] == [20, 15, 21, 17, 6, 5] and b.row(2)["loss_mask"][:6] == [1, 1, 1, 1, 0, 0]
    assert b.row(2)["turn_ids"][:6] == [0] * 6
    assert rep.retokenized_messages == 4 and rep.retokenization_mismatches == 1
    assert rep.mismatch_examples == [
        "row 1: messages[2]: logged 5 ids, the chat template gives 5 (first difference at token 3)"
    ]
    assert b.row(3)["response_ids"][:5] == [20, 15, 21, 17, 6]
    assert sum(v for k, v in rep.notes.items() if "kept as observation tokens" in k) == 1


def test_logprobs_on_every_turn(tok_dir):
    row = convo()
    row["messages"][4] = {
        "role": "assistant",
        "content": "answer 5",
        "token_ids": [25, 23, 6],
        "logprobs": [-1.0, -2.0, -3.0],
    }
    b, _ = from_chat([row], tokenizer=tok_dir)
    assert b.row(0)["rollout_logprobs"] == [-0.5] * 5 + [0.0] * 5 + [-1.0, -2.0, -3.0] + [0.0] * 3


def test_obs_reward_error_and_bad_rows(tok_dir, tmp_path):
    with pytest.raises(
        TrajectoryError,
        match=r"traj_id='c0': field 'messages\[3\].reward': expected rewards on assistant "
        r"messages only \(obs_reward='error'\), found 0.1 on a tool message",
    ):
        from_chat([convo()], tokenizer=tok_dir, obs_reward="error")
    lines = [json.dumps(convo()), json.dumps({"text": "hi"}), json.dumps(convo(id="c9", messages=[SYSTEM, USER]))]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        TrajectoryError,
        match=r"c.jsonl, line 2: field 'messages': expected openai layout: one "
        r"conversation per line with a 'messages' list",
    ):
        from_chat(tmp_path / "c.jsonl", tokenizer=tok_dir)
    b, rep = from_chat(tmp_path / "c.jsonl", tokenizer=tok_dir, errors="collect")
    assert b.traj_ids == ["c0"] and [p.line for p in b.rejected] == [2, 3]
    assert b.rejected[1].field == "messages" and "at least one assistant message" in b.rejected[1].expected
    assert rep.rows_in == 3


def test_template_that_rewrites_history_is_refused(tok_dir):
    tok = load_local_tokenizer(tok_dir)
    # like templates that strip earlier turns' reasoning: earlier assistant messages render without content
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}<|assistant|> <|eot|> "
        "{% else %}<|{{ m['role'] }}|> {{ m['content'] }} <|eot|> {% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    with pytest.raises(
        TrajectoryError,
        match=r"field 'messages\[4\]': expected openai layout: the chat template to render "
        r"the conversation incrementally",
    ):
        from_chat([convo()], tokenizer=tok)


def test_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match=r"^tokenizer: expected a local tokenizer folder with a chat template"):
        from_chat([convo()], tokenizer=None)
    with pytest.raises(ValueError, match=r"^tokenizer: expected a local tokenizer folder, found .*nope"):
        from_chat([convo()], tokenizer=tmp_path / "nope")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"^tokenizer: expected a tokenizer folder .* that does not load"):
        from_chat([convo()], tokenizer=tmp_path / "bad")
