"""Writes the tiny NQ stand-in (60 passages, 24 train and 10 test questions) in DPR's formats (run from the repository
root; the files are committed):
psgs_w100.tsv, biencoder-nq-train.json, nq-test.qa.csv. Invented places, people and facts (no real data):
20 topics of 3 passages; every question's answer is in its positive passage's text, and a founder's name also
in the next topic's third passage ("The fair was opened by ..."): a passage with the answer that is not the
positive, which mined negatives must leave out."""

import csv
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))
from dpr_pipeline.data.answers import has_answer  # noqa: E402

OUT = Path(__file__).resolve().parent
PLACES = ["Varnel", "Ostrava Bay", "Kelmar", "Durnholt", "Saint-Émile", "Brakken", "Lyssa", "Quorran", "Tevid",
          "Mirrow", "Halsted", "Norrvik", "Cadwen", "Pellaro", "Zunford", "Aldmere", "Rivenor", "Sköldby",
          "Fenwick Isle", "Marrow Peak"]
FOUNDERS = ["Henrik Moll", "José Núñez", "Zoë Brandt", "Søren Ekdahl", "Ada Quill", "Tomas Rehn", "Ilse Varga",
            "Marek Dolny", "Nadia Okafor", "Piet Vermaal", "Luca Ferrant", "Greta Holm", "Omar Haddad",
            "Yuki Tanabe", "Rhys Cadogan", "Elif Sahin", "Bram Oosten", "Ines Carvalho", "Kofi Mensah", "Lena Auer"]
RIVERS = ["Dessa", "Orrin", "Vell", "Kast", "Mirel", "Tarn", "Ebbe", "Solva", "Rhune", "Gelt", "Imra", "Pask",
          "Lour", "Nith", "Aven", "Ostra", "Wend", "Carra", "Drel", "Beck"]
GOODS = ["blue glass", "rye whisky", "copper bells", "wool blankets", "salted herring", "clay pipes",
         "lavender oil", "oak barrels", "silver thread", "goat cheese", "river pearls", "linen sails", "honey wine",
         "iron nails", "paper lanterns", "cedar boxes", "amber beads", "felt hats", "tin whistles", "glass beads"]


def main():
    rng = random.Random(7)
    passages, questions = [], []
    for i, place in enumerate(PLACES):
        year = 1700 + 7 * i
        founder, river, goods = FOUNDERS[i], RIVERS[i], GOODS[i]
        base = 3 * i + 1
        texts = [
            f"{place} is a small town founded in {year} by {founder}. The founder chose the site because of its "
            f"sheltered harbour and the old market road.",
            f"The river {river} flows through {place} before it reaches the sea. Locals call the stretch through "
            f'town "the slow water", and a stone bridge crosses it near the town hall.',
            f"{place} is best known for its {goods}, traded at the autumn fair since the town's early years; "
            f"merchants come from the whole coast to buy them. The fair was opened by {FOUNDERS[(i + 1) % 20]}.",
        ]
        for k, text in enumerate(texts):
            passages.append({"id": str(base + k), "title": place, "text": text})
        questions += [
            (f"who founded the town of {place.lower()}", [founder], base),
            (f"which river flows through {place.lower()}", [river, f"river {river}"], base + 1),
            (f"what is {place.lower()} known for", [goods], base + 2),
        ]
    rng.shuffle(questions)
    by_id = {p["id"]: p for p in passages}
    for question, answers, pid in questions:  # the answer is in its passage; a founder also in another topic's
        holders = [p["id"] for p in passages if has_answer(answers, p["text"])]
        assert holders[:1] == [str(pid)] or str(pid) in holders, (question, holders)
        assert len(holders) == (2 if question.startswith("who founded") else 1), (question, holders)

    with open(OUT / "psgs_w100.tsv", "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        for p in passages:
            writer.writerow([p["id"], p["text"], p["title"]])

    def ctx(pid, key="passage_id"):
        p = by_id[str(pid)]
        return {"title": p["title"], "text": p["text"], "score": 1000, "title_score": 1, key: str(pid)}

    train = []
    for n, (question, answers, pid) in enumerate(questions[:24]):
        same_topic = [q for q in range(pid - (pid - 1) % 3, pid - (pid - 1) % 3 + 3) if q != pid]
        holders = {int(p["id"]) for p in passages if has_answer(answers, p["text"])}
        other = rng.sample([q for q in range(1, len(passages) + 1) if q not in same_topic and q not in holders], 2)
        key = "psg_id" if n % 6 == 5 else "passage_id"  # older DPR releases name it psg_id
        train.append({"dataset": "nq_train_psg", "question": question, "answers": answers,
                      "positive_ctxs": [ctx(pid, key)],
                      "negative_ctxs": [ctx(other[1], key)],
                      "hard_negative_ctxs": [ctx(q, key) for q in same_topic + other[:1]]})
    (OUT / "biencoder-nq-train.json").write_text(json.dumps(train, indent=4, ensure_ascii=False) + "\n",
                                                 encoding="utf-8")
    with open(OUT / "nq-test.qa.csv", "w", encoding="utf-8") as handle:
        for question, answers, _pid in questions[24:34]:
            handle.write(f"{question}\t{answers!r}\n")


if __name__ == "__main__":
    main()
