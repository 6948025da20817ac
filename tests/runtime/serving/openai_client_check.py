"""The OpenAI Python client against deltaserve's HTTP API.

Run by http_api_e2e_test.cc with the `openai` package on PYTHONPATH; prints
one JSON object of what each call returned, which the test compares with
`deltaserve generate` and the gRPC API. Usage:

  openai_client_check.py BASE_URL API_KEY MODEL PROMPT_IDS MAX_TOKENS
  openai_client_check.py chat BASE_URL API_KEY MODEL MESSAGES_JSON MAX_TOKENS
"""

import concurrent.futures
import json
import sys

import openai


def ids_of(logprobs_tokens):
    """Token ids from log-probs that name tokens "token_id:ID"."""
    out = []
    for t in logprobs_tokens:
        assert t.startswith("token_id:"), t
        out.append(int(t[len("token_id:"):]))
    return out


def status_error(e):
    return {"status": e.status_code, "message": e.body.get("message"),
            "param": e.body.get("param"), "type": e.body.get("type")}


def chat(base_url, api_key, model, messages, max_tokens):
    """A greedy chat reply, not streamed and streamed, or the server's error."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    args = dict(model=model, messages=json.loads(messages), max_tokens=int(max_tokens),
                temperature=0, logprobs=True, extra_body={"return_tokens_as_token_ids": True})
    result = {}
    try:
        c = client.chat.completions.create(**args)
        m = c.choices[0].message
        result["reply"] = {
            "ids": ids_of([t.token for t in c.choices[0].logprobs.content]),
            "content": m.content,
            "reasoning_content": getattr(m, "reasoning_content", None),
            "tool_calls": [[t.function.name, t.function.arguments] for t in m.tool_calls or []],
            "finish_reason": c.choices[0].finish_reason,
            "usage": [c.usage.prompt_tokens, c.usage.completion_tokens],
            "object": c.object,
        }
    except openai.APIStatusError as e:
        result["reply"] = {"error": status_error(e)}
    ids, content, reasoning, calls, finish, role = [], "", "", [], None, None
    try:
        for chunk in client.chat.completions.create(stream=True, **args):
            for ch in chunk.choices:
                d = ch.delta
                role = role or d.role
                content += d.content or ""
                reasoning += getattr(d, "reasoning_content", None) or ""
                calls += [[t.function.name, t.function.arguments] for t in d.tool_calls or []]
                if ch.logprobs is not None and ch.logprobs.content:
                    ids += ids_of([t.token for t in ch.logprobs.content])
                if ch.finish_reason is not None:
                    finish = ch.finish_reason
        result["stream"] = {"ids": ids, "content": content, "reasoning_content": reasoning,
                            "tool_calls": calls, "finish_reason": finish, "role": role}
    except openai.APIError as e:
        result["stream"] = {"error": str(e)}
    json.dump(result, sys.stdout)


def main():
    if sys.argv[1] == "chat":
        chat(*sys.argv[2:7])
        return
    base_url, api_key, model, prompt, max_tokens = sys.argv[1:6]
    prompt_ids = [int(x) for x in prompt.split(",")]
    max_tokens = int(max_tokens)
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    result = {"models": [m.id for m in client.models.list().data]}

    sampling = {
        "greedy": dict(temperature=0),
        "seeded": dict(temperature=0.8, top_p=0.9, seed=11, extra_body={"top_k": 40}),
    }
    for name, params in sampling.items():
        extra = dict(params.pop("extra_body", {}))
        extra["return_tokens_as_token_ids"] = True
        # Not streamed.
        c = client.completions.create(model=model, prompt=prompt_ids, max_tokens=max_tokens,
                                      logprobs=2, extra_body=extra, **params)
        choice = c.choices[0]
        result[name] = {
            "ids": ids_of(choice.logprobs.tokens),
            "text": choice.text,
            "finish_reason": choice.finish_reason,
            "usage": [c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens],
            "top": [len(t) for t in choice.logprobs.top_logprobs],
            "object": c.object,
        }
        # Streamed, with the usage chunk.
        ids, text, finish, usage = [], "", None, None
        for chunk in client.completions.create(model=model, prompt=prompt_ids,
                                               max_tokens=max_tokens, logprobs=0, stream=True,
                                               stream_options={"include_usage": True},
                                               extra_body=extra, **params):
            if chunk.usage is not None:
                usage = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens]
            for ch in chunk.choices:
                text += ch.text
                if ch.logprobs is not None:
                    ids += ids_of(ch.logprobs.tokens)
                if ch.finish_reason is not None:
                    finish = ch.finish_reason
        result[name + "_stream"] = {"ids": ids, "text": text, "finish_reason": finish,
                                    "usage": usage}

    # Concurrent streams, greedy: prompt i is the prompt rotated by i.
    def stream_ids(i):
        rotated = prompt_ids[i:] + prompt_ids[:i]
        ids = []
        for chunk in client.completions.create(model=model, prompt=rotated, max_tokens=max_tokens,
                                               temperature=0, logprobs=0, stream=True,
                                               extra_body={"return_tokens_as_token_ids": True}):
            for ch in chunk.choices:
                if ch.logprobs is not None:
                    ids += ids_of(ch.logprobs.tokens)
        return ids

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        result["concurrent"] = list(pool.map(stream_ids, range(4)))

    # The prefix cache: a prompt of 5 copies (a page of 64 tokens and more),
    # then that prompt again, streamed: the cached tokens of each.
    long_prompt = prompt_ids * 5
    cached = []
    c = client.completions.create(model=model, prompt=long_prompt, max_tokens=2, temperature=0)
    cached.append(c.usage.prompt_tokens_details.cached_tokens)
    for chunk in client.completions.create(model=model, prompt=long_prompt, max_tokens=2,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.usage is not None:
            cached.append(chunk.usage.prompt_tokens_details.cached_tokens)
    result["cached_tokens"] = cached

    # Errors: OpenAI's exceptions, carrying the server's status and message.
    errors = {}
    for name, call in {
        "temperature": lambda: client.completions.create(model=model, prompt=prompt_ids,
                                                         temperature=-1, max_tokens=2),
        "n": lambda: client.completions.create(model=model, prompt=prompt_ids, n=2,
                                               max_tokens=2),
        "vocabulary": lambda: client.completions.create(model=model, prompt=[1, 100000],
                                                        max_tokens=2),
        "model": lambda: client.completions.create(model="no-such-model", prompt=prompt_ids,
                                                   max_tokens=2),
        "unknown": lambda: client.completions.create(model=model, prompt=prompt_ids,
                                                     max_tokens=2, extra_body={"bogus": 1}),
    }.items():
        try:
            call()
            errors[name] = None
        except openai.APIStatusError as e:
            errors[name] = status_error(e)
    result["errors"] = errors
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
