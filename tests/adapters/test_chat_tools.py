"""Chat conversion loses nothing silently: tool calls become action tokens (through a template that
renders them, or the documented plain rendering), empty turns, unknown tokens and missing rewards are
named in the report's warnings, and mostly-unknown actions are refused unless allowed."""

import json
import math

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from mpo_viz import TrajectoryError
from mpo_viz.adapters import ConversionWarning, from_chat
from mpo_viz.checks import OptionError
from mpo_viz.cli import main
from mpo_viz.data.token_text import load_local_tokenizer

# a ChatML template that renders tool calls (as Qwen's and Hermes' do)
TOOL_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n{{ c.function | tojson }}\n</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# SmolLM2-135M-Instruct's own template: content concatenated (null content raises), no tool calls
SMOL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CALL = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "paris"}'}}


def tool_convo(**over):
    return {
        "id": "a0",
        "group_id": "g",
        "reward": 1.0,
        "messages": [
            {"role": "user", "content": "find paris"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "paris is in france"},
            {"role": "assistant", "content": "france"},
        ],
        **over,
    }


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE tokenizer (ChatML special tokens), built here; the template is set per test."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=special,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["find paris", "paris is in france", "search tool_call arguments name"] * 3, trainer)
    return lambda template: PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", additional_special_tokens=special[:2], chat_template=template
    )


def turn_texts(tok, row):
    """(action text, observation text after it) of each turn, decoded."""
    out = []
    ids, mask, tids = row["response_ids"], row["loss_mask"], row["turn_ids"]
    for k in range(max(tids) + 1):
        act = [i for i, m, t in zip(ids, mask, tids) if t == k and m]
        obs = [i for i, m, t in zip(ids, mask, tids) if t == k and not m]
        out.append((tok.decode(act), tok.decode(obs)))
    return out


def test_tool_calls_through_a_template_that_renders_them(bpe):
    tok = bpe(TOOL_CHATML)
    b, rep = from_chat([tool_convo()], tokenizer=tok)
    r = b.row(0)
    assert tok.decode(r["prompt_ids"]) == "<|im_start|>user\nfind paris<|im_end|>\n<|im_start|>assistant\n"
    # the call (arguments parsed from JSON text, as templates expect) is the turn's action; the
    # template's "\n" after <|im_end|> is an observation token (the model stops at <|im_end|>)
    assert turn_texts(tok, r) == [
        (
            '<tool_call>\n{"name": "search", "arguments": {"q": "paris"}}\n</tool_call><|im_end|>',
            "\n<|im_start|>tool\nparis is in france<|im_end|>\n<|im_start|>assistant\n",
        ),
        ("france<|im_end|>", "\n"),
    ]
    assert rep.tool_calls == 1 and rep.tool_call_rendering == "template" and rep.warnings == []
    assert "1 rendered into action tokens by the tokenizer's chat template" in str(rep)
    assert json.loads(r["messages_json"])[1]["tool_calls"] == [CALL]  # the log's own form is kept


def test_tool_calls_plain_rendering_when_the_template_has_none(bpe):
    tok = bpe(SMOL)  # raises on content null and ignores tool_calls
    rows = [
        tool_convo(),
        tool_convo(
            id="a1",
            messages=[
                {"role": "user", "content": "find paris"},
                {
                    "role": "assistant",
                    "content": "let me look .",
                    "tool_calls": [CALL, {**CALL, "function": {"name": "open", "arguments": "not json"}}],
                },
                {"role": "tool", "content": "ok"},
            ],
        ),
    ]
    b, rep = from_chat(rows, tokenizer=tok)
    assert tok.decode(b.row(0)["prompt_ids"]).startswith(
        "<|im_start|>system\nYou are a helpful AI"
    )  # its default system
    assert (
        turn_texts(tok, b.row(0))[0][0]
        == '<tool_call>{"name": "search", "arguments": {"q": "paris"}}</tool_call><|im_end|>'
    )
    # content first, then one line per call; arguments that are not JSON stay text
    assert turn_texts(tok, b.row(1))[0][0] == (
        'let me look .\n<tool_call>{"name": "search", "arguments": {"q": "paris"}}</tool_call>\n'
        '<tool_call>{"name": "open", "arguments": "not json"}</tool_call><|im_end|>'
    )
    assert rep.tool_calls == 3 and rep.tool_call_rendering == "plain"
    assert (
        "3 rendered into action tokens as plain text by mpo_viz (the chat template does not render tool_calls)"
        in str(rep)
    )
    assert rep.to_dict()["tool_call_rendering"] == "plain"


def test_bad_tool_calls_and_rewards_are_row_problems(bpe):
    tok = bpe(TOOL_CHATML)
    bad_call = tool_convo(id="x0")
    bad_call["messages"][1]["tool_calls"] = [{"type": "function", "function": {"arguments": "{}"}}]
    rows = [bad_call, tool_convo(id="x1", reward="high"), tool_convo(id="x2")]
    b, rep = from_chat(rows, tokenizer=tok, errors="collect")
    assert b.traj_ids == ["x2"]
    p0, p1 = b.rejected
    assert p0.traj_id == "x0" and p0.field == "messages[1].tool_calls[0]" and "a function name" in p0.expected
    assert p1.traj_id == "x1" and p1.field == "reward" and p1.found == "'high'"


def test_empty_turn_is_named(tok_dir):
    row = {
        "id": "e0",
        "reward": 0.0,
        "messages": [
            {"role": "user", "content": "task : add 2 and 3"},
            {"role": "assistant", "content": None},
            {"role": "tool", "content": "result 5"},
            {"role": "assistant", "content": "answer 5"},
        ],
    }
    with pytest.warns(ConversionWarning, match=r"1 assistant turn\(s\) hold no content token .*: e0 messages\[1\]"):
        b, rep = from_chat([row], tokenizer=tok_dir)
    assert rep.empty_turns == 1 and rep.empty_turn_examples == ["e0 messages[1]"]
    assert b.row(0)["response_tokens"][:2] == ["<|eot|>", "<|tool|>"]  # null content is "", not the word None
    assert str(rep).splitlines()[1].startswith("  WARNING               1 assistant turn(s)")


WORDY = {
    "id": "u0",
    "reward": 1.0,
    "messages": [
        {"role": "user", "content": "task : add 2 and 3"},
        {"role": "assistant", "content": "calc 2 + 3"},
        {"role": "tool", "content": "result 5 frobnicated"},
        {"role": "assistant", "content": "answer 5"},
    ],
}


def test_unknown_tokens_counted_per_field_with_a_warning(tok_dir):
    with pytest.warns(
        ConversionWarning,
        match=r"1 of 6 observation tokens \(16.7%\) are the unknown token '\[UNK\]', "
        r"e.g. 'frobnicated' \(u0\)",
    ):
        b, rep = from_chat([WORDY], tokenizer=tok_dir)
    # prompt <user> task : add 2 and 3 <eot> <assistant> = 9 tokens; actions calc 2 + 3 <eot> | answer 5 <eot>
    # = 8; observations <tool> result 5 frobnicated <eot> <assistant> = 6 (nothing after the last turn)
    assert rep.unknown_tokens == {"prompt": [0, 9], "action": [0, 8], "observation": [1, 6]}
    assert rep.unknown_token == "[UNK]" and rep.unknown_examples["observation"] == ["'frobnicated' (u0)"]
    assert "unknown tokens        prompt 0 of 9, action 0 of 8, observation 1 of 6 ('[UNK]')" in str(rep)


def test_mostly_unknown_actions_are_refused_unless_allowed(tok_dir, tmp_path):
    row = {
        **WORDY,
        "messages": [
            WORDY["messages"][0],
            {"role": "assistant", "content": "zork blorp quux wibble"},
            {"role": "tool", "content": "result 5"},
        ],
    }
    with pytest.raises(
        OptionError,
        match=r"^tokenizer: expected a tokenizer that covers the conversations' text, found "
        r"4 of 5 action tokens \(80%\) mapped to its unknown token '\[UNK\]' \(e.g. "
        r"'zork' \(u0\), 'blorp' \(u0\).*allow_unknown=True",
    ):
        from_chat([row], tokenizer=tok_dir)
    with pytest.warns(ConversionWarning, match="4 of 5 action tokens"):
        b, rep = from_chat([row], tokenizer=tok_dir, allow_unknown=True)
    assert len(b) == 1 and rep.unknown_share("action") == 0.8
    (tmp_path / "c.jsonl").write_text(json.dumps(row) + "\n")
    args = [
        "convert",
        "--from",
        "openai",
        str(tmp_path / "c.jsonl"),
        "-o",
        str(tmp_path / "o.parquet"),
        "--tokenizer",
        str(tok_dir),
    ]
    assert main(args) == 1
    assert main([*args, "--allow-unknown-tokens"]) == 0


def test_the_issue_case_plain_calls_through_a_word_tokenizer(tok_dir):
    """Tool calls through a word-level template without tool support: rendered (not an empty turn),
    the rendering stated, and the unknown share refused."""
    row = tool_convo(
        messages=[
            {"role": "user", "content": "task : add 2 and 3"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "result 5"},
        ]
    )
    with pytest.raises(OptionError, match="action tokens"):
        from_chat([row], tokenizer=tok_dir)
    with pytest.warns(ConversionWarning):
        b, rep = from_chat([row], tokenizer=tok_dir, allow_unknown=True)
    assert rep.tool_call_rendering == "plain" and rep.empty_turns == 0
    assert sum(b.row(0)["loss_mask"]) > 1


def test_missing_and_non_finite_rewards_are_named(tok_dir, tmp_path, capsys):
    base = {**WORDY, "messages": [m for m in WORDY["messages"] if "frobnicated" not in m["content"]]}
    rows = [
        {**base, "id": "r0"},
        {**base, "id": "r1", "reward": None},
        {**base, "id": "r2", "reward": math.inf},
        {k: v for k, v in base.items() if k != "reward"} | {"id": "r3"},
        # a reward on a message counts, 0 included
        {k: v for k, v in base.items() if k != "reward"}
        | {"id": "r4", "messages": [*base["messages"][:-1], {**base["messages"][-1], "reward": 0}]},
    ]
    with pytest.warns(
        ConversionWarning,
        match=r"3 trajectories have no finite reward: r1 \(no reward\), r2 \(reward "
        r"inf\), r3 \(no reward\)",
    ):
        b, rep = from_chat(rows, tokenizer=tok_dir)
    assert len(b) == 5 and rep.missing_rewards == 3
    assert rep.to_dict()["missing_reward_examples"] == ["r1 (no reward)", "r2 (reward inf)", "r3 (no reward)"]
    assert b.row(4)["turn_rewards"] == [0.0, 0.0]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert (
        main(
            [
                "convert",
                "--from",
                "openai",
                str(tmp_path / "c.jsonl"),
                "-o",
                str(tmp_path / "o.parquet"),
                "--tokenizer",
                str(tok_dir),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "WARNING               3 trajectories have no finite reward: r1 (no reward)" in out
    assert (
        main(
            [
                "convert",
                "--from",
                "openai",
                str(tmp_path / "c.jsonl"),
                "-o",
                str(tmp_path / "o.parquet"),
                "--tokenizer",
                str(tok_dir),
                "--report-json",
                str(tmp_path / "r.json"),
            ]
        )
        == 0
    )
    assert "warning: 3 trajectories have no finite reward" in capsys.readouterr().err
    assert json.loads((tmp_path / "r.json").read_text())["missing_rewards"] == 3


def test_a_template_that_raises_is_a_row_problem(tok_dir):
    tok = load_local_tokenizer(tok_dir)
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(
        TrajectoryError,
        match=r"field 'messages': expected openai layout: a conversation the chat "
        r"template renders, found it raises .*roles must alternate",
    ):
        from_chat([WORDY], tokenizer=tok)


# --- roles, tools schemas, empty input, v1 scalars, split characters ------------------------------

TYPO = {
    "id": "t0",
    "group_id": "g",
    "reward": 1.0,
    "messages": [
        {"role": "user", "content": "find paris"},
        {"role": "assistant", "content": "search"},
        {"role": "tool", "content": "paris is in france"},
        {"role": "asistant", "content": "france"},
        {"role": "assistant", "content": "paris"},
    ],
}


def test_a_role_typo_is_an_error_naming_conversation_index_and_role(bpe, tmp_path, capsys):
    (tmp_path / "c.jsonl").write_text(json.dumps(TYPO) + "\n")
    with pytest.raises(
        TrajectoryError,
        match=r"c.jsonl, line 1, traj_id='t0': field 'messages\[3\].role': expected one "
        r"of system, developer, user, assistant, tool, function \(or "
        r"unknown_role='observation'.*found 'asistant'",
    ):
        from_chat(tmp_path / "c.jsonl", tokenizer=bpe(TOOL_CHATML))
    tok = bpe(TOOL_CHATML)
    with pytest.warns(
        ConversionWarning,
        match=r"1 message\(s\) with a role that is not an OpenAI chat role kept as "
        r"observation tokens \(loss_mask 0\): t0 messages\[3\] \('asistant'\)",
    ):
        b, rep = from_chat([TYPO], tokenizer=tok, unknown_role="observation")
    r = b.row(0)
    # two assistant turns; the misspelt message is text between them, not trained on
    assert r["num_turns"] == 2 and rep.unknown_roles == 1
    (a0, o0), (a1, o1) = turn_texts(tok, r)
    assert (a0, a1) == ("search<|im_end|>", "paris<|im_end|>")
    assert (
        o0 == "\n<|im_start|>tool\nparis is in france<|im_end|>\n<|im_start|>asistant\nfrance<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert json.loads(r["messages_json"])[3]["role"] == "asistant"
    # the command line: refused by default (exit 1, the problem named), kept with the flag
    args = [
        "convert",
        "--from",
        "openai",
        str(tmp_path / "c.jsonl"),
        "-o",
        str(tmp_path / "o.parquet"),
        "--tokenizer",
        str(_saved(tok, tmp_path)),
    ]
    assert main(args) == 1 and "found 'asistant'" in capsys.readouterr().err
    assert main([*args, "--unknown-role", "observation"]) == 0
    assert "WARNING               1 message(s) with a role" in capsys.readouterr().out


def _saved(tok, tmp_path):
    d = tmp_path / "tok"
    tok.save_pretrained(str(d))
    return d


def test_an_unknown_role_the_template_drops_is_refused_even_when_kept(bpe):
    # a template that renders only the roles it knows (Qwen's skips others): the message would vanish
    known_only = (
        "{% for m in messages %}{% if m['role'] in ['user', 'assistant', 'tool'] %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    b, rep = from_chat([TYPO], tokenizer=bpe(known_only), unknown_role="observation", errors="collect")
    assert len(b) == 0
    (p,) = b.rejected
    assert p.traj_id == "t0" and p.field == "messages[3].role" and p.found == "'asistant', which it renders as nothing"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "find a page",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]
TOOLS_CHATML = (
    "{% if tools %}<|im_start|>system\ntools: {% for t in tools %}{{ t.function.name }} "
    "({{ t.function.description }}) {% endfor %}<|im_end|>\n{% endif %}" + TOOL_CHATML
)


def test_tools_schemas_are_kept_rendered_and_reported(bpe):
    tok = bpe(TOOLS_CHATML)
    b, rep = from_chat([tool_convo(tools=TOOLS), tool_convo(id="a1", tools=TOOLS)], tokenizer=tok)
    r = b.row(0)
    assert json.loads(r["extra_json"])["tools"] == TOOLS
    assert tok.decode(r["prompt_ids"]).startswith("<|im_start|>system\ntools: search (find a page) <|im_end|>\n")
    assert rep.tool_schemas == {"search": 2} and rep.tools_rendering == "template"
    assert (
        "tool schemas          2 in the rows' tools: search (2x); rendered into the prompt by the tokenizer's "
        "chat template and kept in extra_json['tools']"
    ) in str(rep)
    assert rep.to_dict()["tool_schemas"] == {"search": 2}
    # a template without tools support: kept in extra_json, and the report says the prompt lacks them
    b2, rep2 = from_chat([tool_convo(tools=TOOLS)], tokenizer=bpe(TOOL_CHATML))
    assert json.loads(b2.row(0)["extra_json"])["tools"] == TOOLS and rep2.tools_rendering == "kept"
    assert "the prompt tokens do not hold them" in str(rep2)
    # schemas that are not a list of objects: a row problem
    b3, _ = from_chat([tool_convo(tools="search"), tool_convo(id="ok")], tokenizer=tok, errors="collect")
    assert b3.traj_ids == ["ok"] and b3.rejected[0].field == "tools" and b3.rejected[0].found == "'search'"


def test_an_input_without_conversations_is_an_error(bpe, tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("\n")
    for errors in ("raise", "collect"):
        with pytest.raises(
            TrajectoryError,
            match=r"empty.jsonl: field '<file>': expected openai layout: at least one "
            r"conversation .*found none: the input is empty",
        ):
            from_chat(tmp_path / "empty.jsonl", tokenizer=bpe(TOOL_CHATML), errors=errors)
    tok_dir = _saved(bpe(TOOL_CHATML), tmp_path)
    assert (
        main(
            [
                "convert",
                "--from",
                "openai",
                str(tmp_path / "empty.jsonl"),
                "-o",
                str(tmp_path / "o.parquet"),
                "--tokenizer",
                str(tok_dir),
            ]
        )
        == 1
    )
    assert "the input is empty" in capsys.readouterr().err and not (tmp_path / "o.parquet").exists()


def test_v1_scalars_of_a_row_go_to_their_fields(bpe):
    rows = [
        tool_convo(step=3, split="train", sample_idx=1, policy_version=7, note="x"),
        tool_convo(id="a1", step="late"),
    ]
    b, _ = from_chat(rows, tokenizer=bpe(TOOL_CHATML), errors="collect")
    r = b.row(0)
    assert (r["step"], r["split"], r["sample_idx"], r["policy_version"]) == (3, "train", 1, 7)
    assert json.loads(r["extra_json"]) == {"note": "x"}
    assert b.traj_ids == ["a0"] and b.rejected[0].traj_id == "a1" and b.rejected[0].field == "step"


def test_a_character_split_across_byte_level_tokens_shows_once(bpe):
    from mpo_viz.render.strip import strip_payload

    tok = bpe(TOOL_CHATML)
    row = {
        "id": "s0",
        "reward": 1.0,
        "messages": [{"role": "user", "content": "find paris"}, {"role": "assistant", "content": "paris ☀"}],
    }
    b, _ = from_chat([row], tokenizer=tok)
    toks = b.row(0)["response_tokens"]
    ids = b.row(0)["response_ids"]
    assert [tok.decode([i]) for i in ids].count("\ufffd") == 3  # ☀ is three byte tokens e2 98 80
    k = toks.index("☀")
    assert toks.count("☀") == 1 and toks[k - 2 : k] == ["", ""] and "\ufffd" not in "".join(toks)
    assert "".join(toks) == tok.decode(ids)
    notes = strip_payload(b, 0)["notes"]
    assert sorted(notes) == [str(k - 2), str(k - 1), str(k)]
    assert notes[str(k)] == (
        f"'☀': one character split across 3 tokens, shown on the last: #{k - 2} id {ids[k - 2]}; "
        f"#{k - 1} id {ids[k - 1]}; #{k} id {ids[k]}"
    )
