"""Writes this folder: a tiny stand-in for MS MARCO passage ranking and TREC DL 2019/2020, in the official
files' exact formats and names (see README.md here). Deterministic; rerun to regenerate:

    python tests/data/msmarco/generate.py
"""

import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOPICS = ["cat", "dog", "bird", "fish", "horse", "coffee", "tea", "bread", "rice", "apple", "river", "mountain",
          "desert", "forest", "ocean", "volcano", "planet", "comet", "battery", "engine", "bridge", "castle",
          "violin", "piano", "chess", "soccer", "tennis", "glacier", "island", "lighthouse"]
ASPECTS = ["history", "care", "price", "size", "color", "origin", "speed", "weight", "age", "sound"]
FILLER = ("the a of in on with for and is are was to from by about many some most often usually very "
          "known found people make use like good large small old new first").split()


def sentence(rng: random.Random, words: list[str], length: int = 14) -> str:
    body = words + rng.sample(FILLER, length - len(words))
    rng.shuffle(body)
    return " ".join(body).capitalize() + "."


def main() -> None:
    rng = random.Random(13)
    passages, by_pair = [], {}
    pid = 0
    for topic in TOPICS:
        for aspect in rng.sample(ASPECTS, 4):
            passages.append((str(pid), sentence(rng, [topic, aspect, topic]) + " " + sentence(rng, [aspect])))
            by_pair[topic, aspect] = str(pid)
            pid += 1
    pairs = sorted(by_pair)
    rng.shuffle(pairs)
    # (qid, text, positive pid); MS MARCO qids are integers, TREC DL qids too (disjoint ranges here as there).
    queries = [(str(1000 + i), f"what is the {aspect} of a {topic}", by_pair[topic, aspect])
               for i, (topic, aspect) in enumerate(pairs)]
    train, dev, dl19, dl20 = queries[:60], queries[60:80], queries[80:90], queries[90:100]
    (HERE / "collection.tsv").write_text("".join(f"{p}\t{t}\n" for p, t in passages))
    (HERE / "queries.train.tsv").write_text("".join(f"{q}\t{t}\n" for q, t, _ in train))
    (HERE / "qrels.train.tsv").write_text("".join(f"{q}\t0\t{p}\t1\n" for q, _, p in train))
    # dev.small: the queries file holds only judged queries; its qrels are binary, tab-separated.
    (HERE / "queries.dev.small.tsv").write_text("".join(f"{q}\t{t}\n" for q, t, _ in dev))
    (HERE / "qrels.dev.small.tsv").write_text("".join(f"{q}\t0\t{p}\t1\n" for q, _, p in dev))
    # Official BM25 negatives as Tevatron/RocketQA ship them: qid<TAB>pid,pid,... (may contain a positive).
    all_pids = [p for p, _ in passages]
    (HERE / "train.negatives.tsv").write_text("".join(
        f"{q}\t{','.join(rng.sample([x for x in all_pids if x != p], 20))}\n" for q, _, p in train))
    # TREC DL: topics files list more queries than are judged (the unjudged are ignored); graded qrels 0-3,
    # space-separated "qid Q0 pid grade". Each judged query: its positive (3), a same-topic passage (2 or 1)
    # and a judged non-relevant one (0); one query per year has only a grade-1 document besides the 0.
    for year, split in (("2019", dl19), ("2020", dl20)):
        unjudged = [(str(5000 + int(year) % 10 * 100 + i), f"unjudged question {i} about {rng.choice(TOPICS)}")
                    for i in range(3)]
        (HERE / f"msmarco-test{year}-queries.tsv").write_text(
            "".join(f"{q}\t{t}\n" for q, t, _ in split + [(q, t, None) for q, t in unjudged]))
        lines = []
        for i, (q, text, p) in enumerate(split):
            topic = text.split()[-1]
            same_topic = [by_pair[t, a] for t, a in pairs if t == topic and by_pair[t, a] != p]
            other = rng.choice([x for x in all_pids if x != p and x not in same_topic])
            if i == 0:
                lines += [f"{q} Q0 {same_topic[0]} 1", f"{q} Q0 {other} 0"]
            else:
                lines += [f"{q} Q0 {p} 3", f"{q} Q0 {same_topic[0]} {rng.choice([1, 2])}", f"{q} Q0 {other} 0"]
        (HERE / f"{year}qrels-pass.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
