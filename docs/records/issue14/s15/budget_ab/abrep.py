import json,sys,glob,os
D=sys.argv[1]
for f in sorted(glob.glob(D+'/*.json'), key=lambda p:(p.split('_')[-1],p)):
    d=json.load(open(f)); out=[]
    for r in d['rows']:
        m=r['median_us']
        out.append(f"{r['bytes']>>10:3d}K tuned/ds {m['tuned']/m['deepspeed']:.3f} ws1-fake {m['tuned_ws1']-m['fake']:5.2f} async-ws1 {m['tuned_ws1_async']-m['fake']:5.2f} tuned {m['tuned']:5.2f} ds {m['deepspeed']:5.2f}")
    print(f"{os.path.basename(f):12s}", ' | '.join(out))
