"""Writes this ArguAna-like fixture (run from this folder: python generate.py). The texts are written for the
fixture in ArguAna's style (a debate argument and its counter-argument); no ArguAna text is copied."""

import json

# (topic id, debate title, argument, counter-argument); the first ten arguments are the queries.
DEBATES = [
    ("economy-tmwhbsmw", "This house would introduce a tax on sugary drinks",
     "A tax on sugary drinks lowers consumption of sugar, which is a leading cause of obesity and tooth decay. "
     "When Mexico taxed soft drinks, purchases fell, and the revenue can fund school sport and dental care.",
     "A sugar tax falls hardest on poor households, who spend a larger share of their income on food and drink. "
     "Consumers simply switch to cheaper sugary products, so obesity is not reduced, only the budgets of the poor."),
    ("education-thbsuf", "This house believes university education should be free",
     "Free university education opens higher learning to talented students from poor families who are deterred "
     "by tuition fees and debt. Society gains doctors, engineers and teachers it would otherwise lose.",
     "Graduates earn far more over their lifetimes, so taxpayers who never attended university should not pay "
     "for them. Fee-free systems also ration places, which in practice favours wealthier applicants."),
    ("environment-thbnpcc", "This house believes nuclear power is the answer to climate change",
     "Nuclear power stations generate large amounts of electricity without carbon dioxide emissions and run "
     "day and night regardless of the weather, unlike wind turbines and solar panels.",
     "Nuclear plants take decades to build and cost far more than renewables per unit of electricity, so the "
     "money buys more emission cuts when spent on wind, solar and storage. Waste storage remains unsolved."),
    ("health-thbvsbm", "This house would make vaccination mandatory for schoolchildren",
     "Mandatory vaccination protects children who cannot be vaccinated for medical reasons through herd "
     "immunity. Outbreaks of measles return whenever vaccination rates fall below ninety-five percent.",
     "Compulsion breeds distrust of health authorities and hardens opposition among hesitant parents. "
     "Information campaigns and easy access raise uptake without overriding parental consent."),
    ("politics-thwlva", "This house would lower the voting age to sixteen",
     "Sixteen year olds can work, pay taxes and join the army, so they should have a say in the laws that "
     "govern them. Voting early builds a lifelong habit of taking part in elections.",
     "Most sixteen year olds are still in school and live with their parents, whose views they tend to repeat. "
     "Turnout among the youngest voters is low, so lowering the age does little for participation."),
    ("technology-thbsmdh", "This house believes social media does more harm than good",
     "Social media spreads misinformation faster than corrections can follow, and its feeds are designed to keep "
     "users scrolling, which harms the attention and mental health of teenagers.",
     "Social media lets people keep in touch across distance, lets small businesses reach customers for free and "
     "gave protest movements a voice that state television denied them. The harms come from misuse."),
    ("sport-thwbbib", "This house would ban boxing",
     "Boxing is the only sport whose aim is to injure the opponent's brain. Repeated blows to the head cause "
     "lasting damage, dementia and sometimes death in the ring.",
     "Adults should be free to take risks with their own bodies; mountaineering and motor racing kill more "
     "people. A ban would drive boxing underground, where there are no doctors or rules."),
    ("law-thwlcd", "This house would legalise cannabis",
     "Prohibition has failed: cannabis is widely used anyway, and the trade funds organised crime. Legal sales "
     "can be taxed, regulated for strength and kept away from children.",
     "Legal cannabis becomes cheaper and more available, which raises use among young people, whose developing "
     "brains are most at risk of psychosis. Commercial firms will market it as tobacco was marketed."),
    ("economy-thwiubi", "This house would introduce a universal basic income",
     "A universal basic income gives everyone security as automation replaces jobs, and it removes the poverty "
     "trap of means-tested benefits that are withdrawn when people take paid work.",
     "Paying every citizen enough to live on would cost more than the whole current welfare budget, requiring "
     "large tax rises. Money given to the rich is money not spent on those in real need."),
    ("international-thwaeu", "This house would abolish the veto in the UN Security Council",
     "The veto lets five permanent members block action against atrocities committed by themselves or their "
     "allies, which has paralysed the Security Council during many wars.",
     "Without the veto the great powers would leave the United Nations, as the United States left the League "
     "of Nations. The veto keeps them at the table, where disputes are talked through instead of fought."),
    ("health-thbpsbm", "This house would ban smoking in public places",
     "Second-hand smoke harms bar staff and customers who do not smoke; a ban in enclosed public places "
     "protects their health and has reduced heart attacks where it was introduced.",
     "Owners of pubs should decide whether their premises allow smoking, and customers can choose where to "
     "drink. Bans have closed many small village pubs."),
    ("education-thbhoe", "This house believes homework should be abolished",
     "Homework takes time from play, family and sleep, and research finds little benefit for young children.",
     "Homework teaches independent study and lets parents see what their children are learning in school."),
    ("environment-thwbpb", "This house would ban plastic bags",
     "Plastic bags take centuries to break down and choke marine animals; bans have cut litter on beaches.",
     "Paper and cotton bags need far more energy and water to produce, so they must be reused many times to "
     "have a smaller footprint than a plastic bag."),
    ("technology-thwbav", "This house would ban autonomous weapons",
     "Machines that select and kill targets without a human decision cannot be held accountable for war crimes.",
     "Autonomous systems may follow the laws of war more reliably than frightened or vengeful soldiers."),
    ("politics-thwicv", "This house would introduce compulsory voting",
     "Compulsory voting makes parliaments represent the whole population, not just those most likely to vote.",
     "Forcing uninterested citizens to vote adds random choices and violates the freedom not to take part."),
    ("law-thwadp", "This house would abolish the death penalty",
     "Innocent people have been executed, and an execution cannot be undone when new evidence appears.",
     "For the worst murders only the death penalty matches the gravity of the crime and gives justice to victims."),
    ("sport-thwapd", "This house would allow performance enhancing drugs in sport",
     "Doping control has failed; legal, supervised use would be safer than the secret doping of today.",
     "Allowing drugs would force every athlete to take them to compete, harming health and the spirit of sport."),
    ("economy-thwrmw", "This house would raise the minimum wage",
     "A higher minimum wage lifts low-paid workers out of poverty and reduces reliance on state benefits.",
     "Employers respond to higher wage floors by hiring fewer young and unskilled workers."),
    ("international-thwfa", "This house would end foreign aid",
     "Aid props up corrupt governments and creates dependency instead of growth through trade.",
     "Aid has eradicated smallpox and cut child mortality; targeted health aid saves millions of lives."),
    ("health-thwobs", "This house would allow the sale of human organs",
     "A regulated market would end waiting lists for kidneys and the deaths of patients who wait.",
     "Organ markets exploit the poor, who sell parts of their bodies out of desperation."),
]


def main():
    corpus, queries, qrels = [], [], []
    for i, (topic, title, argument, counter) in enumerate(DEBATES):
        argument_id, counter_id = f"test-{topic}-pro01a", f"test-{topic}-con01b"
        corpus.append({"_id": argument_id, "title": title, "text": argument})
        corpus.append({"_id": counter_id, "title": title, "text": counter})
        if i < 10:  # the query is the argument itself (ArguAna: the query is a corpus document)
            queries.append({"_id": argument_id, "text": argument})
            qrels.append((argument_id, counter_id))
    with open("corpus.jsonl", "w", encoding="utf-8") as out:
        out.writelines(json.dumps(doc) + "\n" for doc in corpus)
    with open("queries.jsonl", "w", encoding="utf-8") as out:
        out.writelines(json.dumps(query) + "\n" for query in queries)
    with open("qrels/test.tsv", "w", encoding="utf-8") as out:
        out.write("query-id\tcorpus-id\tscore\n")
        out.writelines(f"{q}\t{d}\t1\n" for q, d in qrels)


if __name__ == "__main__":
    main()
