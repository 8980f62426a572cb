#!/usr/bin/env python3
"""Write a GGUF with gpt-oss's Harmony special tokens and chat template: a model for tests of
Harmony's end-of-turn rule and of grammars that name special tokens.

Built from a fixture with Qwen's byte-level BPE (qwen2-tiny): seven of its unused control
tokens are renamed <|start|>, <|channel|>, <|message|>, <|end|>, <|return|>, <|call|>,
<|constrain|> (control tokens, as in gpt-oss's o200k_harmony vocabulary), the end-of-sequence
token is <|return|> (as gpt-oss's GGUFs have it), and the chat template is gpt-oss's own. The
weights are zero (norms one): every token has the same logit, so what comes out is what a
grammar allows, drawn uniformly.

  mk_harmony_model.py FIXTURE.gguf TEMPLATE.jinja OUT.gguf
"""
import struct, sys, os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'bench'))
import synth_gguf as sg

HARMONY = ['<|start|>', '<|channel|>', '<|message|>', '<|end|>', '<|return|>', '<|call|>', '<|constrain|>']
FIRST = 4073   # qwen2-tiny: <|object_ref_start|> .. <|vision_start|>, unused by the template


def main():
    src, tpl, out = sys.argv[1], sys.argv[2], sys.argv[3]
    kv, tensors = sg.read_template(src)
    kvd = {k: v for k, _, v in kv}
    tokens = list(kvd['tokenizer.ggml.tokens'][1])
    types = list(kvd['tokenizer.ggml.token_type'][1])
    for i, name in enumerate(HARMONY):
        tokens[FIRST + i] = name.encode()
        types[FIRST + i] = 3
    template = open(tpl, 'rb').read()
    arch = kvd['general.architecture'].decode()
    hid = kvd[arch + '.embedding_length']
    nv = len(tokens)
    new = []
    for k, t, v in kv:
        if k == 'tokenizer.ggml.tokens':
            v = (v[0], tokens)
        elif k == 'tokenizer.ggml.token_type':
            v = (v[0], types)
        elif k == 'tokenizer.ggml.eos_token_id':
            v = FIRST + HARMONY.index('<|return|>')
        elif k == 'tokenizer.chat_template':
            v = template
        elif k == 'general.file_type':
            v = 0
        new.append((k, t, v))
    out_t = [(n, d) for n, d, _ in tensors]
    if not any(n == 'output.weight' for n, _ in out_t):
        out_t.append(('output.weight', [hid, nv]))
    align = 32
    header = bytearray(struct.pack('<4sIQQ', b'GGUF', 3, len(out_t), len(new)))
    for k, t, v in new:
        header += sg.w_str(k) + struct.pack('<I', t) + sg.w_val(t, v)
    off, sizes = 0, []
    for name, dims in out_t:
        n = 1
        for d in dims:
            n *= d
        header += sg.w_str(name) + struct.pack('<I', len(dims)) + struct.pack('<' + 'Q' * len(dims), *dims) + struct.pack('<IQ', 0, off)
        sizes.append(n * 4)
        off += (n * 4 + align - 1) // align * align
    header += b'\0' * ((-len(header)) % align)
    with open(out, 'wb') as f:
        f.write(header)
        for size, (name, dims) in zip(sizes, out_t):
            if name.endswith('norm.weight'):
                f.write(struct.pack('<%df' % (size // 4), *([1.0] * (size // 4))))
            else:
                f.write(b'\0' * size)
            f.write(b'\0' * ((-size) % align))
    print(' '.join('%s=%d' % (n, FIRST + i) for i, n in enumerate(HARMONY)))


if __name__ == '__main__':
    main()
