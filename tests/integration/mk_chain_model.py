#!/usr/bin/env python3
"""Write a GGUF whose greedy reply is a known text: a model for end-to-end tests of tool calls.

The tokenizer, template and shapes are those of a fixture (qwen2-tiny: Qwen's byte-level
BPE, a Hermes <tool_call> template). The weights are built, not trained: attention and
feed-forward weights are zero, so each position's logits depend on its own token alone
(logits = output . rmsnorm(token_embd[token])). The reply's tokens t1..tn, chosen all
different from each other and from the prompt's last token t0, get embedding rows e_i
(t_i -> unit vector i) and output rows that send direction i to t_{i+1}; greedy decoding
from t0 then writes exactly t1..tn, whatever came before. The text is spelled with unused
vocabulary tokens (a longest match that skips tokens already taken), so that no token
repeats.

  mk_chain_model.py FIXTURE.gguf OUT.gguf TEXT [LAST_PROMPT_TOKEN_TEXT]
"""
import struct, sys, os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'bench'))
import synth_gguf as sg


def bytes_to_unicode():
    bs = list(range(ord('!'), ord('~') + 1)) + list(range(ord('\xa1'), ord('\xac') + 1)) + list(range(ord('\xae'), ord('\xff') + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tokens, types):
    u2b = bytes_to_unicode()
    out = []
    for t, ty in zip(tokens, types):
        s = t.decode('utf-8', 'replace')
        if ty != 1:      # control / user-defined: the text itself
            out.append(s.encode())
        elif all(ch in u2b for ch in s):
            out.append(bytes(u2b[ch] for ch in s))
        else:
            out.append(None)
    return out


def spell(text, pieces, types, taken):
    """Token ids for text with no id repeated (a search, longest pieces first)."""
    first = {}
    for i, p in enumerate(pieces):
        if p:
            first.setdefault(p[:1], []).append(i)
    budget = [200000]

    def dfs(rest, out):
        if not rest:
            return out
        budget[0] -= 1
        if budget[0] < 0:
            return None
        cands = sorted((i for i in first.get(rest[:1], []) if i not in taken and rest.startswith(pieces[i])),
                       key=lambda i: -len(pieces[i]))
        for i in cands:
            taken.add(i)
            r = dfs(rest[len(pieces[i]):], out + [i])
            if r:
                return r
            taken.discard(i)
        return None

    ids = dfs(text.encode(), [])
    if not ids:
        sys.exit('mk_chain_model: cannot spell %r without repeating a token' % text)
    return ids


def main():
    src, out, text = sys.argv[1], sys.argv[2], sys.argv[3]
    last = sys.argv[4] if len(sys.argv) > 4 else '\n'
    kv, tensors = sg.read_template(src)
    kvd = {k: v for k, _, v in kv}
    tokens = kvd['tokenizer.ggml.tokens'][1]
    types = kvd['tokenizer.ggml.token_type'][1]
    pieces = token_bytes(tokens, types)
    t0 = [i for i, p in enumerate(pieces) if p == last.encode() and types[i] == 1][0]
    chain = [t0] + spell(text, pieces, types, {t0})
    arch = kvd['general.architecture'].decode()
    hid = kvd[arch + '.embedding_length']
    nv = len(tokens)
    if len(chain) > hid:
        sys.exit('mk_chain_model: %d tokens, more than the %d dimensions' % (len(chain), hid))
    out_t = [(n, d, 0) for n, d, _ in tensors]
    if not any(n == 'output.weight' for n, _, _ in out_t):
        out_t.append(('output.weight', [hid, nv], 0))
    kv = [(k, t, (0 if k == 'general.file_type' else v)) for k, t, v in kv]
    align = 32
    header = bytearray(struct.pack('<4sIQQ', b'GGUF', 3, len(out_t), len(kv)))
    for k, t, v in kv:
        header += sg.w_str(k) + struct.pack('<I', t) + sg.w_val(t, v)
    off, sizes = 0, []
    for name, dims, t in out_t:
        n = 1
        for d in dims:
            n *= d
        header += sg.w_str(name) + struct.pack('<I', len(dims)) + struct.pack('<' + 'Q' * len(dims), *dims) + struct.pack('<IQ', 0, off)
        sizes.append(n * 4)
        off += (n * 4 + align - 1) // align * align
    header += b'\0' * ((-len(header)) % align)
    with open(out, 'wb') as f:
        f.write(header)
        for size, (name, dims, _) in zip(sizes, out_t):
            v = [0.0] * (size // 4)
            if name.endswith('norm.weight'):
                v = [1.0] * len(v)
            elif name == 'token_embd.weight':      # row t (hid floats) = e_i
                for i, t in enumerate(chain):
                    v[t * hid + i] = 1.0
            elif name == 'output.weight':          # row t_{i+1} picks direction i
                for i in range(len(chain) - 1):
                    v[chain[i + 1] * hid + i] = 10.0
            f.write(struct.pack('<%df' % len(v), *v))
            f.write(b'\0' * ((-size) % align))
    print(' '.join(str(t) for t in chain[1:]))


if __name__ == '__main__':
    main()
